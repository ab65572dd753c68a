"""bf16 backward matmuls (t2t.nn.mixed_einsum): gradients match float32 autodiff to bf16
accuracy, every dot of a bf16 model's compiled gradient takes bf16 operands; float32 Dense
products keep autodiff's numbers with the backward laid out, other float32 products are
autodiff's."""
import os
import re
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.models.base import LossConfig
from t2t.models.families import make_model
from t2t.nn import mixed_einsum
from t2t.nn.dense import matmul

from tests.nn.helpers import BERT_TINY, GPT_TINY, T5_TINY

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import hlo_ops  # noqa: E402  (benchmarks/hlo_ops.py: dots of an optimized HLO module)

# bf16 has an 8-bit significand (relative rounding 2**-9 = 0.002); the products round both
# operands and the cotangent, so gradients differ from float32 by a few of those relative to
# their largest entry (measured <= 0.005 on these shapes).
REL_TOL = 0.02

CASES = [  # spec, a shape, b shape: Dense (1 and 2 contracted dims), attention, tied logits
    ("abc,cde->abde", (2, 6, 16), (16, 4, 8)),
    ("abcd,cde->abe", (2, 6, 4, 8), (4, 8, 16)),
    ("bqhd,bkhd->bhqk", (2, 5, 4, 8), (2, 7, 4, 8)),
    ("bhqk,bkhd->bqhd", (2, 4, 5, 7), (2, 7, 4, 8)),
    ("...d,vd->...v", (2, 6, 16), (40, 16)),
]


def _random(shape, key):
    return jax.random.normal(jax.random.PRNGKey(key), shape, jnp.float32)


@pytest.mark.parametrize("spec,a_shape,b_shape", CASES)
def test_bf16_gradients_match_float32_autodiff(spec, a_shape, b_shape):
    a, b = _random(a_shape, 0), _random(b_shape, 1)
    probe = _random(jnp.einsum(spec, a, b).shape, 2)

    def loss(a, b, dtype):   # a smooth, non-linear function of the product
        return jnp.sum(jnp.tanh(mixed_einsum.einsum(spec, a, b, dtype)) * probe)

    reference = jax.grad(lambda a, b: jnp.sum(jnp.tanh(jnp.einsum(
        spec, a, b, precision="highest")) * probe), (0, 1))(a, b)
    got = jax.grad(loss, (0, 1))(a, b, jnp.bfloat16)
    for ref, g, x in zip(reference, got, (a, b)):
        assert g.dtype == x.dtype == jnp.float32           # float32 operands, float32 grads
        err = float(jnp.max(jnp.abs(g - ref)) / jnp.max(jnp.abs(ref)))
        assert err < REL_TOL, (spec, err)
        assert err > 0.0                                   # it did compute in bf16


def test_bf16_operand_gets_a_bf16_gradient():
    q, k = _random((2, 5, 4, 8), 0).astype(jnp.bfloat16), _random((2, 7, 4, 8), 1)
    dq, dk = jax.grad(lambda q, k: mixed_einsum.einsum("bqhd,bkhd->bhqk", q, k, jnp.bfloat16)
                      .sum(), (0, 1))(q, k)
    assert (dq.dtype, dk.dtype) == (jnp.bfloat16, jnp.float32)


def test_float32_einsum_is_the_plain_product():
    """No custom VJP for a float32 einsum (attention): autodiff's gradient, bit for bit."""
    q, k = _random((2, 5, 4, 8), 0), _random((2, 7, 4, 8), 1)
    jaxpr = str(jax.make_jaxpr(lambda q: mixed_einsum.einsum("bqhd,bkhd->bhqk", q, k,
                                                             jnp.float32))(q))
    assert "custom_vjp" not in jaxpr
    plain = jax.grad(lambda q: jnp.einsum("bqhd,bkhd->bhqk", q, k).sum())(q)
    np.testing.assert_array_equal(jax.grad(lambda q: mixed_einsum.einsum(
        "bqhd,bkhd->bhqk", q, k, jnp.float32).sum())(q), plain)


@pytest.mark.parametrize("contract,x_shape,w_shape", [(1, (2, 6, 16), (16, 4, 8)),
                                                      (2, (2, 6, 4, 8), (4, 8, 16))])
def test_float32_dense_is_autodiffs_product_laid_out(contract, x_shape, w_shape):
    """A float32 Dense product: the forward is the plain dot bit for bit; both gradients
    are autodiff's sums in another order (laid out for XLA:CPU), equal to f32 rounding."""
    x, w = _random(x_shape, 0), _random(w_shape, 1)
    dims = (tuple(range(x.ndim - contract, x.ndim)), tuple(range(contract)))
    probe = _random(x_shape[:x.ndim - contract] + w_shape[contract:], 2)

    def plain(x, w):
        return jax.lax.dot_general(x, w, (dims, ((), ())))

    def loss(f):
        return lambda x, w: jnp.sum(jnp.tanh(f(x, w)) * probe)

    assert "custom_vjp" in str(jax.make_jaxpr(lambda w: matmul(x, w, contract, jnp.float32))(w))
    np.testing.assert_array_equal(matmul(x, w, contract, jnp.float32), plain(x, w))
    got = jax.grad(loss(lambda x, w: matmul(x, w, contract, jnp.float32)), (0, 1))(x, w)
    want = jax.grad(loss(plain), (0, 1))(x, w)
    for g, ref in zip(got, want):
        assert g.dtype == jnp.float32
        ref = np.asarray(ref)
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_gradient_is_a_row_major_product(dtype):
    """The kernel gradient x^T g of a [batch, length, in] x [in, out] product compiles to a
    dot contracting the LAST dim of its first operand, and g is not written out transposed.
    Autodiff's dot contracts x's leading dim: XLA:CPU runs it in float32 or not at all under
    bf16, and under float32 on its generic kernel after a transposing copy of g."""
    x, w = _random((4, 32, 64), 0), _random((64, 96), 1)
    grad = jax.jit(jax.grad(lambda x, w: jnp.sum(jnp.tanh(matmul(x, w, 1, dtype))), 1))
    text = grad.lower(x, w).compile().as_text()
    contracted = re.findall(r"dot\(.*lhs_contracting_dims=\{(\d+)\}", text)
    ranks = re.findall(r"= \w+\[([\d,]*)\][^ ]* dot\(", text)
    assert contracted and all(int(c) == len(r.split(",")) - 1
                              for c, r in zip(contracted, ranks)), text
    assert not re.search(r"= (f32|bf16)\[96,128\]", text), text   # g [128 tokens, 96], turned


def test_float32_tied_logits_gradient_leaves_the_logits_gradient_in_place():
    """Tied output embedding, logits = x E^T with more vocabulary entries than tokens: the
    table's gradient g^T x is computed as (x^T g)^T, transposing x [128, 16] and the
    [16, 400] product instead of writing g [128 tokens, 400] out transposed
    (`fewest_elements_moved`), and both gradients are autodiff's to float32 rounding."""
    x, table = _random((2, 64, 16), 0), _random((400, 16), 1)
    probe = _random((2, 64, 400), 2)

    def loss(f):
        return lambda x, t: jnp.sum(jnp.tanh(f(x, t)) * probe)

    laid_out = loss(lambda x, t: mixed_einsum.einsum("...d,vd->...v", x, t, jnp.float32,
                                                     float32_layout=True))
    got = jax.grad(laid_out, (0, 1))(x, table)
    want = jax.grad(loss(lambda x, t: jnp.einsum("...d,vd->...v", x, t)), (0, 1))(x, table)
    for g, ref in zip(got, want):
        ref = np.asarray(ref)
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5 * np.max(np.abs(ref)))
    text = jax.jit(jax.grad(laid_out, 1)).lower(x, table).compile().as_text()
    assert not re.search(r"= f32\[400,128\]", text), text    # g [128, 400] turned
    assert not re.search(r"= f32\[400,2,64\]", text), text


def test_unsupported_spec_is_one_line():
    with pytest.raises(ValueError, match="summed over that operand alone"):
        mixed_einsum.einsum("ab,bc->c", _random((2, 3), 0), _random((3, 4), 1), jnp.bfloat16)


# ------------------------------------------------------------------ the compiled gradient
BATCHES = {
    "gpt": {"decoder_input_tokens": np.ones((2, 8), np.int32),
            "decoder_target_tokens": np.ones((2, 8), np.int32),
            "decoder_loss_weights": np.ones((2, 8), np.float32)},
    "t5": {"encoder_input_tokens": np.ones((2, 8), np.int32),
           "decoder_input_tokens": np.ones((2, 4), np.int32),
           "decoder_target_tokens": np.ones((2, 4), np.int32),
           "decoder_loss_weights": np.ones((2, 4), np.float32)},
    "bert": {"encoder_input_tokens": np.ones((2, 8), np.int32),
             "token_type_ids": np.zeros((2, 8), np.int32),
             "masked_positions": np.array([[1, 3], [2, 5]], np.int32),
             "masked_ids": np.ones((2, 2), np.int32),
             "masked_weights": np.ones((2, 2), np.float32),
             "next_sentence_labels": np.zeros((2,), np.int32)},
}
CONFIGS = {"gpt": GPT_TINY, "t5": T5_TINY, "bert": BERT_TINY}


@pytest.mark.parametrize("family", ["gpt", "t5", "bert"])
def test_bf16_gradient_has_only_bf16_dots(family):
    """XLA's optimized HLO of the loss gradient: the matmuls, forward and backward, read bf16
    operands (float32 x float32 dots did two thirds of the FLOPs before the custom VJP)."""
    config = CONFIGS[family].replace(dtype="bfloat16", dropout_rate=0.0)
    model = make_model(family, config, LossConfig())
    batch = BATCHES[family]
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    grad = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch)[0]))
    # Bias gradients (GPT-2, BERT) are sums by a vector of ones: reductions, not matmuls.
    found = hlo_ops.dot_flops(grad.lower(params).compile().as_text(), reductions=False)
    assert len(found) >= 3 * 4, found                      # forward + 2 backward per matmul
    total = sum(f for *_, f in found)
    slow = [d for d in found if d[:2] != ("bf16", "bf16")]
    # XLA upcasts tiny products by itself, forward too (BERT's 2-way NSP classifier)
    assert sum(f for *_, f in slow) <= 0.01 * total, slow
