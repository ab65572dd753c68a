"""BART in t2t beyond its parity tests (tests/convert/test_bart_parity.py): a tiny random
`BartForSequenceClassification` directory with a byte-level BPE tokenizer trained here,
scored by `t2t eval` and continued by `t2t finetune` through BART's fine-tuning head."""

import numpy as np
import pytest
import torch
import transformers as t

from tests.convert.helpers import perturb
from tests.data.helpers import verses
from tests.run.helpers import (LABELS, TRAIN, check_eval_and_finetune,
                               byte_bpe_tokenizer, hf_pair_logits, save_classifier,
                               write_pair_task)
from tests.run.test_hf_classifier import FAST

def bart_tokenizer(path, lines):
    """A byte-level BPE (600 ids; BART's <s> <pad> </s> <unk> <mask> = 0..4) as
    `BartTokenizerFast`."""
    return byte_bpe_tokenizer(path, lines, t.BartTokenizerFast)

def tiny_bart_config(vocab_size: int, **more) -> t.BartConfig:
    return t.BartConfig(vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, **more)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """train/test CSVs of sentence pairs and the command's flags (BART's head)."""
    root = tmp_path_factory.mktemp("bart_classifier")
    rows, flags = write_pair_task(root, FAST, ["--gin.classifier_experiment.family='bart'"])
    return root, rows, flags


@pytest.fixture(scope="module")
def classifier_dir(task, tmp_path_factory):
    """A tiny random BartForSequenceClassification (no dropout) with its tokenizer."""
    path = tmp_path_factory.mktemp("hf") / "bart_classifier"
    tokenizer = bart_tokenizer(path, verses(1000))
    torch.manual_seed(0)
    model = t.BartForSequenceClassification(
        tiny_bart_config(len(tokenizer), num_labels=len(LABELS))).eval()
    perturb(model, 0.3)
    tokenizer = save_classifier(path, model, tokenizer, model.classification_head.out_proj,
                                task[1][TRAIN:])
    return path, model, tokenizer


def test_eval_and_finetune_a_bart_classifier_directory(task, classifier_dir, tmp_path):
    """`t2t eval` predicts transformers' argmax on the rows BART's tokenizer builds, and
    `t2t finetune`'s first loss (BART's head, decoder inputs shifted right) is
    transformers' cross entropy."""
    _, rows, flags = task
    path, model, tokenizer = classifier_dir
    flags = [*flags, f"--gin.INITIAL_CHECKPOINT={path}"]
    train, test = rows[:TRAIN], rows[TRAIN:]
    argmax = check_eval_and_finetune(flags, tmp_path, LABELS, [r[2] for r in test],
                                     hf_pair_logits(model, tokenizer, test), [r[2] for r in train],
                                     hf_pair_logits(model, tokenizer, train))
    assert set(argmax) == {0, 1}


# ----------------------------------------------------------------------- size configs
def _config_of(gin_file):
    from t2t.run import gin_utils
    from t2t.run.configurables import TransformerConfig
    gin_utils.parse([gin_file])
    return gin_utils.query_macro("MODEL_FAMILY"), TransformerConfig()


@pytest.mark.parametrize("gin_file,hf_count", [
    ("models/bart/base.gin", 139_420_416), ("models/bart/large.gin", 406_291_456)])
def test_size_configs_count_hf_parameters(gin_file, hf_count):
    """bart-base / bart-large (counted from shapes: jax.eval_shape, nothing allocated) hold
    HF BartForConditionalGeneration's parameters (its num_parameters(), embeddings and
    positions included) and the final_logits_bias HF keeps as a buffer ([vocab])."""
    from t2t.models.families import count_params
    family, config = _config_of(gin_file)
    assert family == "bart"
    assert count_params(family, config) == hf_count + config.vocab_size


def test_size_configs_are_hf_bart_configs():
    """Each size config is one transformers' BartConfig expresses (`bart_hf_config` checks
    it), with BART's published widths; the test config is tiny."""
    from t2t.convert.hf_bart import bart_config, bart_hf_config
    from t2t.models.families import count_params
    shapes = {"base": (768, 6, 12, 3072), "large": (1024, 12, 16, 4096),
              "tiny": (128, 2, 4, 512), "test": (32, 2, 4, 64)}
    for size, (d, layers, heads, ff) in shapes.items():
        family, config = _config_of(f"models/bart/{size}.gin")
        hf = bart_hf_config(config)
        assert (hf["d_model"], hf["encoder_layers"], hf["decoder_layers"],
                hf["encoder_attention_heads"], hf["encoder_ffn_dim"]) == (d, layers, layers,
                                                                          heads, ff), size
        assert bart_config(hf).replace(dropout_rate=config.dropout_rate) == config.replace(
            attention_dropout_rate=hf["attention_dropout"]), size
    assert count_params(*_config_of("models/bart/test.gin")) < 200_000


# ----------------------------------------------------------------------- decoding
def _decoding_model(seed: int, path):
    """A tiny random BartForConditionalGeneration whose greedy and beam outputs end at
    varied lengths: weights perturbed, the decoder's positions scaled up (each step's state
    differs) and </s>'s logit bias raised so that it competes."""
    torch.manual_seed(seed)
    model = t.BartForConditionalGeneration(tiny_bart_config(100)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
        model.final_logits_bias.normal_(0.0, 0.2)
        model.final_logits_bias[0, 2] += 1.0
        model.model.decoder.embed_positions.weight.mul_(5.0)
    model.save_pretrained(path, safe_serialization=True)
    return model


def _encoder_rows(seed: int):
    rng = np.random.RandomState(seed)
    ids = rng.randint(3, 100, (4, 12))
    mask = np.ones_like(ids)
    for row, end in enumerate((12, 9, 5, 3)):
        mask[row, end:] = 0
    return np.where(mask == 1, ids, 1), mask


@pytest.mark.parametrize("seed,beams", [(0, 1), (0, 3), (11, 1), (11, 3),
                                        pytest.param(11, 4, marks=pytest.mark.slow)])
def test_greedy_and_beam_tokens_equal_transformers_generate(seed, beams, tmp_path):
    """t2t's decoding (KV cache; `decoder_start_id` 2 first) of a converted BART == HF
    `generate` with the same settings, spelled out on both sides: no sampling, no forced
    BOS/EOS, no n-gram blocking, no length penalty (HF length_penalty=0.0, t2t alpha=0),
    HF's early_stopping=False (stop once no live beam can beat the worst finished one: t2t's
    rule), and fairseq's/HF's rule that only the best `beams` expansions of a step may
    finish (t2t `finish_in_beam=True`). HF pads after </s> with 1, t2t with 0."""
    from t2t.convert.pretrained import load_pretrained
    from t2t.models import decoding
    from t2t.models.t5 import EncoderDecoderModel
    n = 16
    model = _decoding_model(seed, tmp_path)
    ids, mask = _encoder_rows(seed)
    settings = t.GenerationConfig(
        num_beams=beams, max_new_tokens=n, do_sample=False, length_penalty=0.0,
        early_stopping=False, no_repeat_ngram_size=0, forced_bos_token_id=None,
        forced_eos_token_id=None, min_length=0, decoder_start_token_id=2, eos_token_id=2,
        pad_token_id=1, bos_token_id=0)
    model.generation_config = settings     # nothing of the model's own defaults left
    with torch.no_grad():
        ref = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                             generation_config=settings).numpy()
    assert (ref[:, 0] == 2).all()
    loaded = load_pretrained(tmp_path)
    options = {} if beams == 1 else dict(strategy="beam", beam_size=beams, alpha=0.0,
                                         finish_in_beam=True)
    ours = np.asarray(decoding.decode(
        EncoderDecoderModel(loaded.config), loaded.params,
        {"encoder_input_tokens": ids.astype(np.int32),
         "encoder_segment_ids": mask.astype(np.int32)}, max_decode_length=n, eos_id=2,
        **options))
    want = np.zeros_like(ours)
    for row, tokens in enumerate(ref[:, 1:].tolist()):
        tokens = tokens[:tokens.index(2) + 1] if 2 in tokens else tokens
        want[row, :len(tokens)] = tokens
    np.testing.assert_array_equal(ours, want)
    lengths = {int(np.sum(row > 0)) for row in ours}
    assert len(lengths) > 1 or beams == 1     # beams end at several lengths


# ----------------------------------------------------------------------- t2t train / infer
def test_pretraining_rows_start_the_decoder_with_decoder_start_id():
    """experiments/bart_tiny_bible.gin (text infilling): the converter shifts the targets
    right with BART's start id 2 (`decoder_start_id`), T5's run with 0."""
    from t2t.run import experiment, gin_utils
    rows = {}
    for name, model in (("bart_tiny_bible", "models/bart/test.gin"),
                        ("t5_tiny_bible", "models/t5/1_1/test.gin")):
        gin_utils.parse([f"experiments/{name}.gin", model], [
            "MODEL_DIR = '/tmp/unused'", "BATCH_SIZE = 2",
            "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 32}"])
        exp = experiment.experiment()
        rows[name] = next(exp.data())
    bart, t5 = rows["bart_tiny_bible"], rows["t5_tiny_bible"]
    for batch, start in ((bart, 2), (t5, 0)):
        seg, pos = batch["decoder_segment_ids"], batch["decoder_positions"]
        first = (seg > 0) & (pos == 0)
        assert first.any() and (batch["decoder_input_tokens"][first] == start).all()
        later = (seg > 0) & (pos > 0)
        np.testing.assert_array_equal(batch["decoder_input_tokens"][:, 1:][later[:, 1:]],
                                      batch["decoder_target_tokens"][:, :-1][later[:, 1:]])


@pytest.fixture(scope="module")
def pretrained_run(tmp_path_factory):
    """`t2t train` of experiments/bart_tiny_bible.gin at the test size (float32, no dropout:
    the train step then compiles in 4 s instead of 10) for three steps, and that MODEL_DIR
    written as an HF BART directory by `t2t convert`."""
    from t2t.cli import main
    root = tmp_path_factory.mktemp("bart_run")
    assert main(["train", "--gin_file=experiments/bart_tiny_bible.gin",
                 "--gin_file=models/bart/test.gin", f"--gin.MODEL_DIR={root / 'run'}",
                 "--gin.TransformerConfig.dtype='float32'", "--gin.TRAIN_STEPS=3",
                 "--gin.TransformerConfig.dropout_rate=0.0",
                 "--gin.TransformerConfig.attention_dropout_rate=0.0",
                 "--gin.BATCH_SIZE=8", "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, "
                 "'targets': 32}", "--gin.make_schedule.warmup_steps=100",
                 *[f"--gin={b}" for b in FAST]]) == 0
    assert main(["convert", str(root / "run"), str(root / "hf"), "--model_type", "bart"]) == 0
    return root / "run", root / "hf"


@pytest.mark.parametrize("strategy", ["greedy", pytest.param("beam", marks=pytest.mark.slow)])
def test_infer_equals_transformers_generate_on_the_converted_directory(
        pretrained_run, strategy, monkeypatch, capsys):
    """`t2t infer` of the pretrained tiny BART (greedy; beam 3 with alpha 0) prints, line for
    line, the text of transformers' `generate` on its `t2t convert`ed directory (start id 2,
    the Bible vocabulary's eos 1, the same 12 steps). Beam with `--finish_in_beam`,
    transformers' rule (tests/models/test_decoding.py: where T5X's default differs)."""
    import io
    from t2t.cli import main
    from t2t.data import tasks
    run, hf_dir = pretrained_run
    lines = ["In the beginning God created the heavens.", "Jesus wept.", "Amen."]
    beam = ["--strategy", "beam", "--beam_size", "3", "--alpha", "0", "--finish_in_beam"] \
        if strategy == "beam" else []
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    capsys.readouterr()
    assert main(["infer", "--gin_file=experiments/finetune_t5_tiny_bible_en_es.gin",
                 "--gin_file=models/bart/test.gin", f"--gin.MODEL_DIR={run}",
                 "--gin.INITIAL_CHECKPOINT=unused", "--gin.TransformerConfig.dtype='float32'",
                 "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 12}", *beam]) == 0
    printed = capsys.readouterr().out.splitlines()

    task = tasks.get_task("bible_translate_en_es")
    vocab = task.vocabulary
    model = t.BartForConditionalGeneration.from_pretrained(hf_dir).eval()
    settings = t.GenerationConfig(
        num_beams=3 if beam else 1, max_new_tokens=12, do_sample=False, length_penalty=0.0,
        early_stopping=False, no_repeat_ngram_size=0, forced_bos_token_id=None,
        forced_eos_token_id=None, decoder_start_token_id=2, eos_token_id=1, pad_token_id=0)
    model.generation_config = settings
    want = []
    for line in lines:
        ids = torch.tensor([list(vocab.encode(task.input_prefix + line)) + [1]])
        with torch.no_grad():
            out = model.generate(input_ids=ids, generation_config=settings)[0, 1:].tolist()
        want.append(" ".join(vocab.decode(out[:out.index(1)] if 1 in out else out).split()))
    assert printed == want
