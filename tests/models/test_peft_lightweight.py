"""Prefix tuning, adapters and prompt tuning against their definitions; cached decoding
with prompts or prefixes; every lightweight method trains only its own parameters (the rest
bit-identical) through `Trainer`, in the papers' counts. (LoRA's merge and prompt insertion:
test_peft.py.)"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from t2t.models import classifiers as C
from t2t.models import lightweight as L
from t2t.models import peft
from t2t.models.gpt import DecoderOnlyModel
from t2t.nn.adapter import Adapter
from t2t.nn.attention import MultiHeadAttention, segment_mask

from tests.models.test_classifiers import BERT, GPT, bert_batch, jit, random_params, sentences
from tests.nn.helpers import init


# ----------------------------------------------------------------------------- definitions
def test_prefix_attention_is_attention_over_prefix_then_keys():
    """softmax(q·[P_k; K]ᵀ/√d + mask) · [P_v; V], computed by hand in numpy, with padding."""
    cfg = BERT.replace(prefix_length=3)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, cfg.d_model))
    seg = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    mask = segment_mask(seg, seg)
    attn = MultiHeadAttention(cfg, use_prefix=True)
    p = init(attn, x, x, mask)
    assert p["prefix_key"].shape == p["prefix_value"].shape == (3, cfg.num_heads, cfg.head_dim)
    p["prefix_key"] = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (3, 4, 8)))
    p["prefix_value"] = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (3, 4, 8)))
    got = attn.apply({"params": p}, x, x, mask)

    xs, w = np.asarray(x, np.float64), jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    proj = lambda n: np.einsum("ble,ehd->blhd", xs, w[n]["kernel"]) + w[n]["bias"]  # noqa
    q, k, v = proj("query"), proj("key"), proj("value")
    k = np.concatenate([np.broadcast_to(w["prefix_key"], (2, 3, 4, 8)), k], 1)
    v = np.concatenate([np.broadcast_to(w["prefix_value"], (2, 3, 4, 8)), v], 1)
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(8)
    visible = np.concatenate([np.ones((2, 1, 5, 3), bool), np.asarray(mask)], -1)
    logits = np.where(visible, logits, -1e10)
    prob = np.exp(logits - logits.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bkhd->bqhd", prob, v)
    want = np.einsum("bqhd,hde->bqe", ctx, w["out"]["kernel"]) + w["out"]["bias"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Without the option nothing changes: no prefix parameters.
    assert "prefix_key" not in init(MultiHeadAttention(cfg), x, x, mask)


def test_adapter_is_its_formula_and_starts_near_identity():
    cfg = BERT.replace(adapter_size=4)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, cfg.d_model))
    p = init(Adapter(cfg), x)
    w = jax.tree.map(np.asarray, p)
    assert w["down"]["kernel"].shape == (32, 4) and w["up"]["kernel"].shape == (4, 32)
    assert 0.005 < w["down"]["kernel"].std() < 0.015 and np.abs(w["down"]["kernel"]).max() <= 0.03
    assert not w["down"]["bias"].any() and not w["up"]["bias"].any()
    got = Adapter(cfg).apply({"params": p}, x)
    h = np.asarray(jax.nn.gelu(np.asarray(x) @ w["down"]["kernel"], approximate=False))
    np.testing.assert_allclose(got, np.asarray(x) + h @ w["up"]["kernel"], atol=1e-6)
    assert float(jnp.abs(got - x).max()) < 1e-2 * float(jnp.abs(x).max())
    # A whole classifier with adapters starts at (nearly) the base classifier's outputs.
    tokens, _ = sentences(4)
    batch = bert_batch(tokens)
    base = C.SequenceClassifier(BERT, 2)
    params = nn.unbox(jit(base.init, jax.random.PRNGKey(0), batch))
    model = L.AdapterTuning(base, adapter_size=4)
    tree = nn.unbox(jit(model.init_from_pretrained, jax.random.PRNGKey(1), batch, params))
    adapted, plain = jit(lambda a, b: (model.apply(a, batch), base.apply(b, batch)), tree, params)
    assert 0 < float(jnp.abs(adapted - plain).max()) < 0.02 * float(jnp.abs(plain).max())


def _greedy_without_cache(model, params, prompt, steps, width=16):
    """Argmax continuation by a full causal forward pass per new token (one row, no cache;
    right padding to a fixed width, which a causal model never reads)."""
    forward = jax.jit(lambda p, t: model.apply(p, {"decoder_input_tokens": t}))
    seq = list(prompt)
    for _ in range(steps):
        logits = forward(params, jnp.asarray([seq + [0] * (width - len(seq))]))
        seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
    return seq[len(prompt):]


def _lively(model, batch, std=0.3):
    """The wrapper's tree with the base leaves random at `std` (tiny random models at 0.02
    only repeat their last token)."""
    tree = nn.unbox(jit(model.init, jax.random.PRNGKey(0), batch))
    base = random_params(model.base_model.module.init, jax.random.PRNGKey(0),
                         batch["decoder_input_tokens"], std=std)
    return C.merge_pretrained(tree, base)[0]


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_cached_decoding_equals_decoding_without_cache(method):
    """GPT with prompts (or prefixes): `predict` on the KV cache (left-padded prompts of two
    lengths, prompt slots cached first) emits the tokens a cache-free argmax loop emits."""
    base = DecoderOnlyModel(GPT)
    model = (L.PromptTuning(base, num_prompts=3, init="normal") if method == "prompt"
             else L.PrefixTuning(base, prefix_length=3, hidden=16))
    prompts = [[0, 7, 9, 11, 5], [0, 21, 4]]
    batch = {"decoder_input_tokens": jnp.asarray([p + [0] * (5 - len(p)) for p in prompts])}
    params = _lively(model, batch)
    got = model.predict(params, batch, prompt_lengths=np.array([5, 3]), max_decode_length=6,
                        eos_id=None)
    plain = base.predict(model.to_base(params) if method == "prefix" else
                         {k: v for k, v in params.items() if k != "prompt"}, batch,
                         prompt_lengths=np.array([5, 3]), max_decode_length=6, eos_id=None)
    for row, prompt in enumerate(prompts):
        assert list(np.asarray(got[row])) == _greedy_without_cache(model, params, prompt, 6)
    assert not np.array_equal(np.asarray(got), np.asarray(plain))   # the method mattered
    if method == "prompt":   # other prompt values: not served by the first compiled loop
        other = {**params, "prompt": 3.0 * jax.random.normal(jax.random.PRNGKey(5),
                                                            (3, GPT.d_model))}
        again = model.predict(other, batch, prompt_lengths=np.array([5, 3]),
                              max_decode_length=6, eos_id=None)
        assert list(np.asarray(again[0])) == _greedy_without_cache(model, other, prompts[0], 6)
        assert not np.array_equal(np.asarray(again), np.asarray(got))


# ----------------------------------------------------------------------------- training
def _expected_trainable(method, model, tree):
    """The papers' parameter counts, from the config (d, h·d_h, L, d_ff) and the head."""
    cfg, d, hd, n_layers = model.config, BERT.d_model, BERT.num_heads * BERT.head_dim, \
        BERT.num_encoder_layers
    head = d * d + d + d * 2 + 2                                   # pooler + classifier
    if method == "lora":                                           # r(d_in + d_out) per kernel
        return head + n_layers * 2 * model.rank * (d + hd)
    if method == "prompt":                                         # n · E
        return head + model.num_prompts * d
    if method == "prefix":                                         # P' + MLP(d -> k -> 2·L·hd)
        k, out = model.hidden, 2 * n_layers * hd
        return head + model.prefix_length * d + d * k + k + k * out + out
    m = cfg.adapter_size                                           # 2 adapters of 2md + d + m
    norms = n_layers * 2 * 2 * d + 2 * d                           # layer norms + embedding's
    return head + n_layers * 2 * (2 * m * d + d + m) + norms


@pytest.mark.all_devices
@pytest.mark.parametrize("method", ["lora", "prompt", "prefix", "adapter"])
def test_only_the_method_parameters_train(method):
    """A frozen-base classifier trained by `Trainer` with `peft.freeze` (as `t2t finetune`
    does): the frozen leaves are bit-identical after the steps, every trainable leaf
    moved, and the trainable count is the paper's formula."""
    from t2t.train import partitioning
    from t2t.train.trainer import TrainConfig, Trainer

    tokens, label = sentences(16, seed=3)
    batch = {k: np.asarray(v) for k, v in bert_batch(tokens, label=label).items()}
    base = C.SequenceClassifier(BERT, 2)
    options = {"lora": dict(rank=2), "prompt": dict(num_prompts=4),
               "prefix": dict(prefix_length=4, hidden=16), "adapter": dict(adapter_size=4)}
    model = L.METHODS[method](base, **options[method])
    trainer = Trainer(model, peft.freeze(optax.adam(5e-3), model.is_frozen),
                      partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1)),
                      TrainConfig(model_dir="unused"))
    state = trainer.init_state(batch)
    before = jax.device_get(state.params)
    assert model.trainable_count(before) == _expected_trainable(method, model, before)
    for _ in range(3):
        state, _ = trainer.train_step(state, batch)
    after = jax.device_get(state.params)
    for path, old in jax.tree_util.tree_leaves_with_path(before):
        name = jax.tree_util.keystr(path, simple=True, separator="/")
        new = after
        for key in name.split("/"):
            new = new[key]
        if model.is_frozen(name):
            np.testing.assert_array_equal(new, old, err_msg=name)
        else:
            assert not np.array_equal(new, old), f"{name} did not train"
    trainable = {"/".join(p) for p in traverse_util.flatten_dict(after)
                 if not model.is_frozen("/".join(p))}
    tx_state = peft.tree_bytes(state.opt_state)
    assert tx_state == 2 * 4 * model.trainable_count(after) + 4     # Adam: μ, ν per leaf
    if method == "prefix":   # after training only P = MLP(P') is kept: 2·L·p·h·d_h numbers
        assert trainable >= {"prefix_mlp/embedding"}
        dropped = model.drop_reparameterization(after)
        plain = L.PrefixTuning(base, prefix_length=4, reparameterize=False)
        plain.init(jax.random.PRNGKey(0), batch)
        assert "prefix_mlp" not in dropped
        assert plain.trainable_count(dropped) == (d := BERT.d_model) * d + d + 2 * d + 2 \
            + 2 * BERT.num_encoder_layers * 4 * BERT.num_heads * BERT.head_dim
        np.testing.assert_allclose(jit(plain.apply, dropped, batch),
                                   jit(model.apply, after, batch), rtol=1e-5, atol=1e-6)


def test_wrap_selects_a_method_by_name():
    base = C.SequenceClassifier(BERT, 2)
    assert L.wrap(base) is base
    assert isinstance(L.wrap(base, "prefix"), L.PrefixTuning)
    with pytest.raises(ValueError, match="wrap.method='bitfit'; choose one of"):
        L.wrap(base, "bitfit")
