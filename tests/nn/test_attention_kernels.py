"""`TransformerConfig.attention_kernel`: which kernel each platform gets, when a layer falls
back to XLA, and the splash kernel's numbers against t2t's XLA attention.

Splash runs here in Pallas' interpreter (this host has no TPU); `t2t compile` tests
(tests/train/test_compile.py) compile it for a TPU slice.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import attention_kernels as ak
from t2t.nn.attention import causal_mask, combine_masks, dot_product_attention, segment_mask
from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import Decoder

KW = dict(dropout_rate=0.0, dropout_rng=None, deterministic=True, dtype=jnp.float32)
PLAIN = dict(q_len=256, k_len=128, bias=False, dropout=False, structured=True)


@pytest.mark.parametrize("platform, kernel", [("cpu", "xla"), ("tpu", "splash"),
                                              ("gpu", "cudnn"), ("cuda", "cudnn")])
def test_auto_picks_the_platforms_kernel(platform, kernel):
    assert ak.choose("auto", platform=platform, **PLAIN) == kernel
    assert ak.choose("xla", platform=platform, **PLAIN) == "xla"


@pytest.mark.parametrize("change, reason", [
    (dict(bias=True), "relative position bias"),
    (dict(dropout=True), "dropout"),
    (dict(structured=False), "dense mask"),
    (dict(q_len=114), "not multiples of its 128-wide blocks"),
])
def test_splash_falls_back_to_xla_and_says_why(caplog, change, reason):
    ak._fall_back.cache_clear()
    with caplog.at_level("INFO", logger="t2t.nn.attention_kernels"):
        assert ak.choose("auto", platform="tpu", **{**PLAIN, **change}) == "xla"
    assert reason in caplog.text and "runs on XLA" in caplog.text


@pytest.mark.parametrize("change, reason", [
    (dict(dtype="float32"), "float32 inputs"),
    (dict(head_dim=12), "head_dim 12"),
    (dict(head_dim=320), "head_dim 320"),
    (dict(bias=True, q_len=113), "odd lengths 113 x 128 with a bias"),
    (dict(q_len=1), "a decoding step"),
])
def test_cudnn_on_a_gpu_falls_back_where_cudnn_cannot_run(caplog, change, reason):
    """jax/_src/cudnn's own checks, made before tracing so a layer runs on XLA instead
    of failing to compile; the same call in bfloat16 with head_dim 64 takes cuDNN."""
    ak._fall_back.cache_clear()
    fits = {**PLAIN, "dtype": "bfloat16", "head_dim": 64}
    assert ak.choose("auto", platform="gpu", **{**fits, "bias": True}) == "cudnn"
    with caplog.at_level("INFO", logger="t2t.nn.attention_kernels"):
        assert ak.choose("auto", platform="gpu", **{**fits, **change}) == "xla"
    assert reason in caplog.text and "runs on XLA" in caplog.text
    assert ak.choose("cudnn", platform="cpu", **{**fits, **change}) == "cudnn"  # JAX's XLA


def test_heads_the_mesh_does_not_split_fall_back():
    """GPT-2 XL's 25 heads on tensor=2: XLA, so the parameter check's one line is what a
    person sees (tests/train/test_compile.py)."""
    mesh = jax.make_mesh((4, 2), ("fsdp", "tensor"))
    with jax.set_mesh(mesh), nn.logical_axis_rules([("batch", "fsdp"), ("heads", "tensor")]):
        assert ak.choose("splash", platform="tpu", batch_heads=(8, 24), **PLAIN) == "splash"
        assert ak.choose("splash", platform="tpu", batch_heads=(8, 25), **PLAIN) == "xla"
        assert ak.choose("splash", platform="tpu", batch_heads=(2, 24), **PLAIN) == "xla"


def test_an_unknown_kernel_is_a_config_error():
    with pytest.raises(ConfigError, match="attention_kernel='flash'; choose one of"):
        TransformerConfig(attention_kernel="flash")


def test_auto_on_the_cpu_is_xla_with_unchanged_numbers():
    """A tiny GPT: 'auto' builds no SegmentedMask here and gives 'xla''s logits exactly."""
    assert jax.default_backend() == "cpu" and not ak.wants_structure("auto")
    tokens = jnp.array([[5, 6, 7, 8, 9, 10, 0, 0]])
    segments = jnp.array([[1, 1, 1, 2, 2, 2, 0, 0]])
    logits = {}
    for kernel in ("auto", "xla"):
        cfg = TransformerConfig(vocab_size=16, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                                num_encoder_layers=0, num_decoder_layers=2, dropout_rate=0.0,
                                attention_kernel=kernel, position_embedding="learned",
                                max_length=8)
        model = Decoder(cfg)
        params = model.init(jax.random.PRNGKey(0), tokens, decoder_segment_ids=segments)
        logits[kernel] = model.apply(params, tokens, decoder_segment_ids=segments)
    np.testing.assert_array_equal(logits["auto"], logits["xla"])


def _qkv(b, q_len, k_len, heads=1, d=16):
    r = jax.random.split(jax.random.PRNGKey(0), 3)
    return (jax.random.normal(r[0], (b, q_len, heads, d)),
            jax.random.normal(r[1], (b, k_len, heads, d)),
            jax.random.normal(r[2], (b, k_len, heads, d)))


def test_splash_equals_xla_attention_causal_and_packed():
    """Two packed examples and padding in row 0, one example in row 1: every real query's
    output agrees (padding queries attend padding under splash, nothing under XLA)."""
    q, k, v = _qkv(2, 128, 128)
    seg = jnp.array([[1] * 60 + [2] * 50 + [0] * 18, [1] * 128])
    dense = combine_masks(causal_mask(128), segment_mask(seg, seg))
    ref = dot_product_attention(q, k, v, dense, None, scale=0.25, **KW)
    out = dot_product_attention(q, k, v, ak.SegmentedMask(dense, seg, seg, True), None,
                                scale=0.25, kernel="splash", **KW)
    real = (seg > 0)[:, :, None, None]
    assert float(jnp.max(jnp.abs(jnp.where(real, out - ref, 0.0)))) < 1e-5


def test_splash_cross_attention_of_other_lengths():
    """Decoder queries (128) over encoder keys (256), segments on both sides."""
    q, k, v = _qkv(1, 128, 256)
    q_seg = jnp.array([[1] * 100 + [2] * 28])
    k_seg = jnp.array([[1] * 200 + [2] * 40 + [0] * 16])
    dense = segment_mask(q_seg, k_seg)
    ref = dot_product_attention(q, k, v, dense, None, scale=0.25, **KW)
    out = dot_product_attention(q, k, v, ak.SegmentedMask(dense, q_seg, k_seg), None,
                                scale=0.25, kernel="splash", **KW)
    assert float(jnp.max(jnp.abs(out - ref))) < 1e-5


@pytest.mark.parametrize("mesh_shape", [None, (4, 2)])
def test_splash_with_a_pattern_per_head(mesh_shape):
    """`pattern` as one splash mask per head (head 0 causal, head 1 a band of 16 a side)
    equals XLA attention under each head's dense mask, alone and on a 4 x 2 (fsdp x
    tensor) mesh that gives each device one head and that head's mask."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm
    q, k, v = _qkv(4, 128, 128, heads=2)
    pattern = [sm.CausalMask((128, 128)), sm.LocalMask((128, 128), (16, 16), 0)]
    i = np.arange(128)
    dense = jnp.asarray(np.stack([i[:, None] >= i[None], np.abs(i[:, None] - i[None]) <= 16]))
    ref = dot_product_attention(q, k, v, dense[None], None, scale=1.0, **KW)

    def run(q, k, v):
        return ak.splash_attention(q, k, v, None, pattern=pattern)

    if mesh_shape is None:
        out = run(q, k, v)
    else:
        mesh = jax.make_mesh(mesh_shape, ("fsdp", "tensor"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        with jax.set_mesh(mesh), nn.logical_axis_rules([("batch", "fsdp"),
                                                        ("heads", "tensor")]):
            out = jax.jit(run)(q, k, v)
    assert float(jnp.max(jnp.abs(out - ref))) < 1e-5
    with pytest.raises(ValueError, match="1 head masks for 2 heads"):
        ak.splash_attention(q, k, v, None, pattern=pattern[:1])


@pytest.mark.slow
def test_splash_gradients_equal_xla():
    q, k, v = _qkv(1, 128, 128, heads=2)
    seg = jnp.array([[1] * 70 + [2] * 58])
    dense = combine_masks(causal_mask(128), segment_mask(seg, seg))

    def loss(kernel, mask):
        return lambda q, k, v: jnp.sum(dot_product_attention(
            q, k, v, mask, None, scale=0.25, kernel=kernel, **KW) ** 2)

    want = jax.grad(loss("xla", dense), argnums=(0, 1, 2))(q, k, v)
    got = jax.grad(loss("splash", ak.SegmentedMask(dense, seg, seg, True)),
                   argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(want, got):
        assert float(jnp.max(jnp.abs(a - b))) < 1e-4


def test_structured_masks_only_where_splash_may_run():
    cfg = TransformerConfig(attention_kernel="splash")
    seg = jnp.ones((1, 4), jnp.int32)
    made = ak.structured_mask(cfg, segment_mask(seg, seg), seg, seg, causal=True)
    assert isinstance(made, ak.SegmentedMask) and made.causal
    np.testing.assert_array_equal(ak.dense(made), segment_mask(seg, seg))
    plain = ak.structured_mask(TransformerConfig(attention_kernel="xla"),
                               segment_mask(seg, seg), seg, seg)
    assert not isinstance(plain, ak.SegmentedMask)


def test_cudnn_on_a_gpu_asks_jax_for_cudnn_by_name(monkeypatch):
    """jax.nn.dot_product_attention's default implementation is XLA on every backend, so
    the GPU path must name cuDNN; the [1, heads, q, k] bias reaches it unbroadcast, in the
    inputs' dtype (cuDNN sums its gradient over the batch)."""
    seen = {}

    def fake(q, k, v, *, bias, mask, scale, implementation):
        seen.update(bias=bias, mask=mask, implementation=implementation)
        return q

    monkeypatch.setattr(ak, "target_platform", lambda: "gpu")
    monkeypatch.setattr(jax.nn, "dot_product_attention", fake)
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(2, 8, 8, heads=4, d=64))
    bias = jnp.zeros((1, 4, 8, 8), jnp.float32)
    dot_product_attention(q, k, v, causal_mask(8), bias, scale=1.0, kernel="auto",
                          **{**KW, "dtype": jnp.bfloat16})
    assert seen["implementation"] == "cudnn"
    assert seen["bias"].shape == (1, 4, 8, 8) and seen["bias"].dtype == jnp.bfloat16
    assert seen["mask"].shape == (1, 1, 8, 8)
    seen.clear()
    dot_product_attention(q.astype(jnp.float32), k.astype(jnp.float32),
                          v.astype(jnp.float32), None, bias, scale=1.0, kernel="auto", **KW)
    assert not seen        # float32 inputs: t2t's XLA attention, cuDNN never called
