"""`t2t convert` end to end through the command line (`t2t.cli.main`).

t2t -> Hugging Face: a RoBERTa-tiny (and, marked slow, an ELECTRA-tiny) trained two steps
by `t2t train` (shrunk to d_model 16 / 32), converted from their MODEL_DIRs; transformers' own classes, loaded
from the written directories, give the logits of t2t's modules on the restored checkpoint
within 1e-5. Hugging Face -> t2t -> Hugging Face: a tiny random directory per family,
written by transformers, read and written back by the command; the re-read model's logits
equal the original's within 1e-5. A directory the command cannot read gets one line on
stderr and exit 2.
"""
import json

import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.cli import main
from tests.convert.helpers import hf_logits, padded_batch, perturb

TOL = 1e-5
SHRINK = ["--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=8", "--gin.WARMUP_STEPS=1",
          "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'max_predictions': 4}",
          "--gin.TransformerConfig.d_model=16", "--gin.TransformerConfig.d_ff=32",
          "--gin.TransformerConfig.head_dim=8", "--gin.TrainConfig.progress_bar=False",
          "--gin.TrainConfig.async_checkpoint=False"]


def _train(experiment, model_dir, *extra):
    argv = ["train", f"--gin_file=experiments/{experiment}.gin",
            f"--gin.MODEL_DIR={model_dir}", *SHRINK, *extra]
    assert main(argv) == 0


def _restored(model_dir):
    """(TransformerConfig in float32, params) of a MODEL_DIR: its operative config.gin (the
    vocabulary size is the task's, as in training) and latest checkpoint."""
    from t2t.run import configurables as configured
    from t2t.run import gin_utils
    from t2t.train.checkpoints import restore_params
    params = restore_params(str(model_dir))
    gin_utils.parse([str(model_dir / "config.gin")], [])
    vocab = params["token_embedder"]["embedding"].shape[0]
    return configured.TransformerConfig().replace(dtype="float32", vocab_size=vocab), params


def _ids(vocab, pad_id):
    """Three rows of 12, two right-padded; ids from 5 on (past the WordPiece specials)."""
    return padded_batch(5, vocab, 12, pad_id, ends=(None, 9, 4))


def _max_diff(a, b, mask):
    return float(np.abs(a - b)[mask.astype(bool)].max())


@pytest.fixture(scope="module")
def roberta_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("roberta") / "run"
    _train("roberta_tiny_bible", run)
    return run


def test_roberta_run_dir_to_hf(roberta_run, tmp_path, capsys):
    from t2t.models.bert import BertModel
    run, out = roberta_run, tmp_path / "hf"
    capsys.readouterr()
    assert main(["convert", str(run), str(out), "--model_type", "roberta"]) == 0
    printed = capsys.readouterr().out
    config, params = _restored(run)
    hf = transformers.RobertaForMaskedLM.from_pretrained(out).eval()
    count = sum(p.numel() for p in hf.parameters())      # the tied output table once
    assert f"RobertaForMaskedLM (roberta), {count:,d} parameters" in printed
    ids, mask = _ids(config.vocab_size, 0)
    ours = np.asarray(BertModel(config).apply({"params": params}, ids, mask,
                                              method=BertModel.mlm_logits))
    diff = _max_diff(hf_logits(hf, ids, mask), ours, mask)
    print(f"roberta run -> HF: max|logit diff| {diff:.3g}")
    assert diff < TOL


@pytest.mark.slow    # a second `t2t train` (ELECTRA's step compiles two encoders): ~40 s
def test_electra_run_dir_to_generator_and_discriminator(tmp_path, capsys):
    from t2t.models.electra import ElectraPretraining
    from t2t.run import configurables as configured
    run, out = tmp_path / "run", tmp_path / "hf"
    # d_model 32 of 4 heads: the 1/4-width generator keeps whole heads (8 = 1 x 8), which
    # HF's ELECTRA needs (num_heads x head_dim == hidden_size); embeddings of width 8.
    _train("electra_tiny_bible", run, "--gin.TransformerConfig.d_model=32",
           "--gin.TransformerConfig.num_heads=4", "--gin.TransformerConfig.embedding_dim=8")
    assert main(["convert", str(run), str(out), "--model_type", "electra"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["discriminator", "generator"]
    config, params = _restored(run)
    generator = configured.MODEL_CLASSES["electra"](config).generator_config
    module = ElectraPretraining(config, generator)
    ids, mask = _ids(config.vocab_size, 0)
    everywhere = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).astype(np.int32)
    want = {
        "generator": module.apply({"params": params}, ids, everywhere, mask,
                                  method=ElectraPretraining.generate),
        "discriminator": module.apply({"params": params}, ids, mask,
                                      method=ElectraPretraining.discriminate)}
    classes = {"generator": transformers.ElectraForMaskedLM,
               "discriminator": transformers.ElectraForPreTraining}
    for name, cls in classes.items():
        hf = cls.from_pretrained(out / name).eval()
        diff = _max_diff(hf_logits(hf, ids, mask), np.asarray(want[name]), mask)
        print(f"electra run -> HF {name}: max|logit diff| {diff:.3g}")
        assert diff < TOL, name
    assert json.loads((out / "generator" / "config.json").read_text())["hidden_size"] == 8


def test_mlm_eval_command_on_the_run(roberta_run, tmp_path, capsys):
    """`t2t mlm_eval` (t2t/run/encoder_eval.py) on the same run: one line, the JSON, and
    the loss of a model two steps from its random start near ln(vocab)."""
    capsys.readouterr()
    out = tmp_path / "eval.json"
    assert main(["mlm_eval", str(roberta_run), "--batches", "2", "--json", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    metrics = json.loads(out.read_text())[str(roberta_run)]
    assert line.startswith(f"{roberta_run}: mlm_loss {metrics['mlm_loss']:.4f}")
    assert abs(metrics["mlm_loss"] - np.log(8064)) < 0.5 and metrics["tokens"] > 100
    assert main(["mlm_eval", str(tmp_path)]) == 2
    assert "has no config.gin" in capsys.readouterr().err


# ---------------------------------------------------------------- Hugging Face -> t2t -> HF
def _hf_models():
    """test_pretrained_parity's tiny random models of every family, and a T5."""
    from tests.convert.test_pretrained_parity import V, _models
    t = transformers
    return {**_models(), "t5": lambda: t.T5ForConditionalGeneration(t.T5Config(
        vocab_size=V, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
        dropout_rate=0.0, feed_forward_proj="gated-gelu", tie_word_embeddings=False))}


def _logits(model, ids, mask):
    t5 = isinstance(model, transformers.T5ForConditionalGeneration)
    return hf_logits(model, ids, mask, **({"decoder_input_ids": ids[:, :5]} if t5 else {}))


@pytest.mark.parametrize("model_type", list(_hf_models()))
def test_hf_dir_through_t2t_and_back(tmp_path, capsys, model_type):
    torch.manual_seed(0)
    original = _hf_models()[model_type]().eval()
    perturb(original)
    src, out = tmp_path / "src", tmp_path / "out"
    original.save_pretrained(src, safe_serialization=True)
    assert main(["convert", str(src), str(out)]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith(f"{out}: {type(original).__name__} ({original.config.model_type}), ")
    again = type(original).from_pretrained(out).eval()
    assert sum(p.numel() for p in again.parameters()) == sum(
        p.numel() for p in original.parameters())
    ids, mask = _ids(original.config.vocab_size, original.config.pad_token_id or 0)
    diff = _max_diff(_logits(again, ids, mask), _logits(original, ids, mask),
                     mask[:, :5] if model_type == "t5" else mask)
    print(f"{model_type}: HF -> t2t -> HF max|logit diff| {diff:.3g}")
    assert diff < TOL


# ------------------------------------------------------------------------- one-line errors
def _write(path, config=None, weights=False):
    path.mkdir(parents=True)
    if config is not None:
        (path / "config.json").write_text(json.dumps(config))
    if weights:
        (path / "pytorch_model.bin").write_bytes(b"pickle, refused")
    return path


@pytest.mark.parametrize("config, weights, flags, message", [
    (None, True, [], "has neither config.json (Hugging Face) nor config.gin"),
    (None, False, ["--model_type", "bert"], "has neither config.json (Hugging Face) nor "
                                            "config.gin"),
    ({"model_type": "reformer"}, True, [], "model_type 'reformer' is not supported"),
    ({"hidden_size": 8}, True, [], "has no 'model_type'"),
    ({"model_type": "bert", "vocab_size": 9, "hidden_size": 8, "num_attention_heads": 2,
      "intermediate_size": 8, "num_hidden_layers": 1}, True, [],
     "no model.safetensors or model.safetensors.index.json"),
])
def test_unreadable_directory_is_one_line(tmp_path, capsys, config, weights, flags, message):
    src = _write(tmp_path / "src", config, weights)
    assert main(["convert", str(src), str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("t2t convert: error: "), err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_missing_directory_and_unknown_model_type(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    run = _write(tmp_path / "run")
    (run / "config.gin").write_text("")
    assert main(["convert", str(run), str(tmp_path / "out"), "--model_type", "reformer"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'reformer' is not supported" in err
