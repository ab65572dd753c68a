"""`load_pretrained` / `save_pretrained` for every family: tiny random HF models (each
tensor perturbed) -> t2t logits equal HF's within 1e-5; t2t -> HF directory -> transformers
gives bit-identical outputs; one-line errors for directories t2t cannot read."""
import json

import jax
import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.convert import hf as convert  # noqa: E402
from t2t.convert.hf_encoders import roberta_positions  # noqa: E402
from t2t.convert.pretrained import PretrainedError, pretrained  # noqa: E402
from tests.convert.helpers import hf_logits as _hf_logits  # noqa: E402
from tests.convert.helpers import padded_batch, perturb  # noqa: E402

TOL = 1e-5
V, L = 96, 24
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)


def _models():
    t = transformers
    return {
        "bert": lambda: t.BertForMaskedLM(t.BertConfig(vocab_size=V, max_position_embeddings=40,
                                                       **SMALL)),
        "roberta": lambda: t.RobertaForMaskedLM(t.RobertaConfig(
            vocab_size=V, max_position_embeddings=L + 2, type_vocab_size=1, pad_token_id=1,
            **SMALL)),
        # ALBERT's default gelu_new (tanh) activation; 3 layers through one shared layer.
        "albert": lambda: t.AlbertForPreTraining(t.AlbertConfig(
            vocab_size=V, embedding_size=16, max_position_embeddings=40,
            **dict(SMALL, num_hidden_layers=3), classifier_dropout_prob=0.0)),
        "electra_discriminator": lambda: t.ElectraForPreTraining(t.ElectraConfig(
            vocab_size=V, embedding_size=16, max_position_embeddings=40, **SMALL)),
        "electra_generator": lambda: t.ElectraForMaskedLM(t.ElectraConfig(
            vocab_size=V, embedding_size=24, max_position_embeddings=40, hidden_act="relu",
            **SMALL)),
        "electra_same_width": lambda: t.ElectraForPreTraining(t.ElectraConfig(
            vocab_size=V, embedding_size=32, max_position_embeddings=40, **SMALL)),
        "distilbert": lambda: t.DistilBertForMaskedLM(t.DistilBertConfig(
            vocab_size=V, dim=32, n_layers=2, n_heads=4, hidden_dim=64, dropout=0.0,
            attention_dropout=0.0, max_position_embeddings=40, initializer_range=0.2)),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config(
            vocab_size=V, n_positions=40, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)),
    }


KINDS = list(_models())


def _batch(pad_id):
    return padded_batch(3, V, L, pad_id)


@pytest.fixture(scope="module", params=KINDS)
def hf_dir(request, tmp_path_factory):
    torch.manual_seed(0)
    model = _models()[request.param]().eval()
    perturb(model)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return request.param, model, path


def test_logits_parity(hf_dir):
    kind, model, path = hf_dir
    m = convert.load_pretrained(path)
    assert m.architecture == type(model).__name__
    ids, mask = _batch(m.pad_token_id)
    ref = _hf_logits(model, ids, mask)
    ours = m.logits(ids, mask)
    assert ours.shape == ref.shape
    real = mask.astype(bool)
    diff = np.abs(ours - ref)[real].max()
    print(f"{kind}: max|logit diff| {diff:.3g} (max|logit| {np.abs(ref).max():.3g})")
    assert diff < TOL


def test_save_round_trip(hf_dir, tmp_path):
    kind, model, path = hf_dir
    m = convert.load_pretrained(path)
    convert.save_pretrained(m, tmp_path)
    again = convert.load_pretrained(tmp_path)
    assert (again.model_type, again.config) == (m.model_type, m.config)
    jax.tree.map(np.testing.assert_array_equal, again.params, m.params)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    ids, mask = _batch(m.pad_token_id)
    np.testing.assert_array_equal(_hf_logits(reloaded, ids, mask), _hf_logits(model, ids, mask))


def test_roberta_positions_offset():
    ids = np.array([[0, 5, 6, 2, 1, 1], [1, 1, 0, 7, 2, 1]])
    np.testing.assert_array_equal(np.asarray(roberta_positions(ids, 1)),
                                  [[2, 3, 4, 5, 1, 1], [1, 1, 2, 3, 4, 1]])


def test_albert_shares_one_layer(tmp_path):
    hf_albert = _models()["albert"]()
    hf_albert.save_pretrained(tmp_path, safe_serialization=True)
    m = convert.load_pretrained(tmp_path)
    assert set(m.params["encoder"]["layers"]) == {"layer"}
    assert m.config.share_layers and m.config.embedding_dim == 16
    assert m.params["token_embedder"]["embedding"].shape == (V, 16)
    n = sum(x.size for x in jax.tree_util.tree_leaves(m.params))
    assert n == sum(p.numel() for p in hf_albert.parameters())


def _write(path, config=None, weights=True):
    path.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (path / "config.json").write_text(config if isinstance(config, str)
                                          else json.dumps(config))
    if weights:
        (path / "pytorch_model.bin").write_bytes(b"not read")
    return path


@pytest.mark.parametrize("config, message", [
    (None, "has no config.json"),
    ("{not json", "not valid JSON"),
    ({"hidden_size": 4}, "has no 'model_type'"),
    ({"model_type": "reformer"}, "model_type 'reformer' is not supported"),
    ({"model_type": "roberta", "hidden_size": 8}, "has no 'num_attention_heads'"),
    ({"model_type": "albert", "num_hidden_groups": 2, "hidden_size": 8, "num_attention_heads": 2,
      "vocab_size": 9, "intermediate_size": 8, "num_hidden_layers": 2}, "num_hidden_groups=2"),
    ({"model_type": "distilbert", "vocab_size": 9, "dim": 8, "n_heads": 2, "hidden_dim": 8,
      "n_layers": 1}, "safetensors"),
])
def test_unreadable_directories_one_line(tmp_path, config, message):
    path = _write(tmp_path / "d", config)
    with pytest.raises(PretrainedError, match=message) as e:
        convert.load_pretrained(path)
    assert "\n" not in str(e.value)


def test_not_a_directory_and_no_head(tmp_path):
    with pytest.raises(PretrainedError, match="is not a directory"):
        convert.load_pretrained(tmp_path / "missing")
    hf_bert = transformers.BertModel(transformers.BertConfig(vocab_size=V, **SMALL))
    hf_bert.save_pretrained(tmp_path / "bare", safe_serialization=True)
    m = convert.load_pretrained(tmp_path / "bare")
    with pytest.raises(PretrainedError, match="no MLM head"):
        m.logits(np.ones((1, 4), np.int32))
    with pytest.raises(PretrainedError, match="'reformer' is not supported"):
        pretrained("reformer", m.config, m.params)


def test_electra_pretraining_tree_exports_both_models(tmp_path):
    """A t2t ELECTRA (generator + discriminator, shared embeddings) -> two HF directories
    whose logits equal t2t's generator MLM and discriminator RTD outputs."""
    import flax.linen as nn
    from t2t.convert.pretrained import from_t2t
    from t2t.models.electra import ElectraPretraining, ElectraPretrainingModel
    hf_cfg = transformers.ElectraConfig(vocab_size=V, embedding_size=16,
                                        max_position_embeddings=40, **SMALL)
    config = convert.bert_config(hf_cfg.to_dict()).replace(
        embedding_dim=16, project_summed_embeddings=True)
    model = ElectraPretrainingModel(config, generator_size=0.5)
    ids, mask = _batch(0)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), {
        "encoder_input_tokens": ids, "masked_positions": np.zeros((3, 2), np.int32)}))
    out = from_t2t("electra", config, params, model.generator_config)
    positions = np.broadcast_to(np.arange(L), ids.shape).astype(np.int32)
    apply = lambda method, *a: np.asarray(model.module.apply(  # noqa: E731
        {"params": params}, *a, method=method))
    want = {"generator": apply(ElectraPretraining.generate, ids, positions, mask),
            "discriminator": apply(ElectraPretraining.discriminate, ids, mask)}
    classes = {"generator": transformers.ElectraForMaskedLM,
               "discriminator": transformers.ElectraForPreTraining}
    real = mask.astype(bool)
    for name, m in out.items():
        convert.save_pretrained(m, tmp_path / name)
        ref = _hf_logits(classes[name].from_pretrained(tmp_path / name).eval(), ids, mask)
        assert np.abs(ref - want[name])[real].max() < TOL, name
