"""GPT-1 parity: HF OpenAIGPTLMHeadModel <-> t2t (random weights both ways, through
`load_pretrained` / `save_pretrained`), the gpt1/base.gin parameter count, and the
fine-tuning format against OpenAIGPTDoubleHeadsModel / GPT2DoubleHeadsModel."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.convert import hf, hf_gpt1, pretrained as hf_pretrained
from t2t.data.gpt_format import SpecialTokens, format_features
from t2t.models.gpt_format import GptFormatClassifier
from t2t.nn.stacks import Decoder
from tests.convert.helpers import perturb

TOL = 1e-5
VOCAB, N_POS, LEN = 100, 64, 20
SMALL = dict(n_positions=N_POS, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
             embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)


def _openai_config(vocab=VOCAB):
    # initializer_range 0.2 puts the gelu inputs at O(1), where tanh and exact gelu differ.
    return transformers.OpenAIGPTConfig(vocab_size=vocab, **SMALL)


@pytest.fixture(scope="module")
def hf_lm(tmp_path_factory):
    torch.manual_seed(0)
    model = transformers.OpenAIGPTLMHeadModel(_openai_config()).eval()
    perturb(model)
    path = str(tmp_path_factory.mktemp("openai_gpt"))
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def _batch():
    ids = np.random.RandomState(0).randint(0, VOCAB, (3, LEN)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 13:] = 0      # right padding: real positions are unaffected by a causal model
    mask[2, 4:] = 0
    return ids, mask


def _hf_logits(model, ids, mask):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()


def test_hf_to_t2t_logits(hf_lm):
    model, path = hf_lm
    loaded = hf.load_pretrained(path)
    c = loaded.config
    assert (loaded.model_type, c.pre_norm, c.mlp_activations, c.d_ff) == \
        ("openai-gpt", False, ("gelu_tanh",), 128)
    ids, mask = _batch()
    diff = np.abs(loaded.logits(ids, mask) - _hf_logits(model, ids, mask))[mask == 1].max()
    print(f"openai-gpt HF -> t2t: max|logits diff| = {diff:.3g}")
    assert diff < TOL


def test_t2t_to_hf_logits_and_round_trip(hf_lm, tmp_path):
    """Fresh t2t weights -> save_pretrained -> transformers gives t2t's logits; and a
    loaded checkpoint saves back to the same tensors."""
    config = hf_gpt1.openai_gpt_config(_openai_config().to_dict()).replace(dropout_rate=0.0)
    ids, mask = _batch()
    params = nn.unbox(Decoder(config).init(jax.random.PRNGKey(3),
                                           ids[:, :4].astype(np.int32))["params"])
    noise = np.random.RandomState(4)
    params = jax.tree.map(lambda x: np.asarray(x) + 0.1 * noise.randn(*x.shape), params)
    model = hf_pretrained.pretrained("openai-gpt", config, params)
    hf.save_pretrained(model, str(tmp_path / "out"))
    reloaded = transformers.OpenAIGPTLMHeadModel.from_pretrained(str(tmp_path / "out")).eval()
    diff = np.abs(model.logits(ids, mask) - _hf_logits(reloaded, ids, mask))[mask == 1].max()
    print(f"openai-gpt t2t -> HF: max|logits diff| = {diff:.3g}")
    assert diff < TOL
    _, path = hf_lm
    hf.save_pretrained(hf.load_pretrained(path), str(tmp_path / "again"))
    before, after = hf.read_safetensors(path), hf.read_safetensors(str(tmp_path / "again"))
    assert set(after) == {k for k in before if k != "lm_head.weight"}   # tied: left out
    for name, value in after.items():
        np.testing.assert_array_equal(value, before[name])


def test_base_preset_counts_hf_parameters():
    from t2t.models.families import count_params
    from t2t.run import gin_utils
    from t2t.run.configurables import TransformerConfig
    gin_utils.parse(["models/gpt1/base.gin"])
    ours = count_params(gin_utils.query_macro("MODEL_FAMILY"), TransformerConfig())
    with torch.device("meta"):
        ref = transformers.OpenAIGPTLMHeadModel(transformers.OpenAIGPTConfig())
    assert ours == sum(p.numel() for p in ref.parameters()) == 116_534_784


def test_export_refuses_a_pre_ln_config():
    config = hf_gpt1.openai_gpt_config(_openai_config().to_dict()).replace(pre_norm=True)
    with pytest.raises(ValueError, match="pre_norm=False"):
        hf_gpt1.openai_gpt_hf_config(config)


# ----------------------------------------------------------------------- double heads
def _double_heads(model_type, vocab):
    torch.manual_seed(1)
    if model_type == "openai-gpt":
        model = transformers.OpenAIGPTDoubleHeadsModel(_openai_config(vocab))
        config = hf_gpt1.openai_gpt_config(model.config.to_dict())
    else:
        model = transformers.GPT2DoubleHeadsModel(transformers.GPT2Config(
            vocab_size=vocab, n_inner=None, summary_first_dropout=0.0, **SMALL))
        config = hf.gpt2_config(model.config.to_dict())
    perturb(model.eval())
    model.tie_weights()
    return model, config


def _mc_features(special, max_length=16):
    rng = np.random.RandomState(2)
    text = lambda n: list(rng.randint(3, VOCAB, n))  # noqa: E731
    examples = [(text(6), [text(3), text(9), text(1)], 1),
                (text(12), [text(2), text(4), text(5)], 2)]      # cut longest-first
    return format_features("multiple_choice", examples, special, max_length)


@pytest.mark.parametrize("model_type", ["openai-gpt", "gpt2"])
def test_double_heads_parity(model_type):
    special = SpecialTokens.after(VOCAB)
    model, config = _double_heads(model_type, VOCAB + 3)
    config = config.replace(dropout_rate=0.0, attention_dropout_rate=0.0)
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    params = hf_gpt1.double_heads_from_hf(model_type, state, config)
    ours = GptFormatClassifier(config, 3, "choice")
    batch = {k: np.asarray(v) for k, v in _mc_features(special).items()}
    out = ours.apply(params, batch)
    # HF gets no attention_mask (OpenAIGPTModel does not flatten a [batch, choices, length]
    # one); with right padding a causal model's real positions never see the padding.
    labels = np.where(batch["decoder_segment_ids"] == 1, batch["decoder_input_tokens"], -100)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
                    mc_token_ids=torch.tensor(batch["extract_positions"], dtype=torch.long),
                    labels=torch.tensor(labels, dtype=torch.long),
                    mc_labels=torch.tensor(batch["label"], dtype=torch.long))
    real = batch["decoder_segment_ids"] == 1
    d_lm = np.abs(np.asarray(out["lm_logits"]) - ref.logits.numpy())[real].max()
    d_mc = np.abs(np.asarray(out["logits"]) - ref.mc_logits.numpy()).max()
    print(f"{model_type} double heads: max|diff| lm_logits {d_lm:.3g}, mc_logits {d_mc:.3g}")
    assert d_lm < TOL and d_mc < TOL
    for lm_weight in (0.5, 0.0):             # L3 = mc_loss + lambda * lm_loss (eq. 5)
        loss, metrics = GptFormatClassifier(config, 3, "choice",
                                            lm_weight=lm_weight).loss_fn(params, batch)
        assert float(metrics["task_loss"]) == pytest.approx(ref.mc_loss.item(), abs=TOL)
        assert float(metrics["lm_loss"]) == pytest.approx(ref.loss.item(), abs=TOL)
        assert float(loss) == pytest.approx(ref.mc_loss.item() + lm_weight * ref.loss.item(),
                                            abs=TOL)
    # t2t -> HF: the same tensors load back into a fresh double-heads model
    fresh, _ = _double_heads(model_type, VOCAB + 3)
    missing, unexpected = fresh.load_state_dict(
        {k: torch.tensor(v) for k, v in hf_gpt1.double_heads_to_hf(model_type, config,
                                                                    params).items()},
        strict=False)
    assert [m for m in missing if not m.endswith((".attn.bias", ".masked_bias"))] == \
        ["lm_head.weight"] and not unexpected
    fresh.tie_weights()
    with torch.no_grad():
        again = fresh(input_ids=torch.tensor(batch["decoder_input_tokens"], dtype=torch.long),
                      mc_token_ids=torch.tensor(batch["extract_positions"], dtype=torch.long))
    np.testing.assert_array_equal(again.mc_logits.numpy(), ref.mc_logits.numpy())
