"""Two-operand einsum: low-precision operands and float32 accumulation forward AND backward.

Mixed precision (Micikevicius et al. 2018, "Mixed Precision Training", Sec. 3: float32
master weights, half-precision operands, float32 accumulation of the products) asks for
the backward matmuls to take half-precision inputs as well. Plain autodiff of
``einsum(a.astype(bf16), b.astype(bf16), preferred_element_type=float32)`` does not: the
cotangent of the float32 product arrives as float32, so both backward products (the input
gradient and the kernel gradient, two thirds of a step's matmul FLOPs) run float32 x
float32 after XLA upcasts the bf16 operand. The custom VJP here casts the cotangent to the
compute dtype and computes

    da = einsum(C,B->A)(g, b),   db = einsum(A,C->B)(a, g)      for  c = einsum(A,B->C)(a, b)

with bf16 operands and float32 accumulation; the gradients are returned in the primal
operands' dtypes (a float32 kernel gets its gradient un-rounded, in float32).

The backward products are laid out explicitly (``_product``) in the forms XLA:CPU's
YNNPACK dot kernels take in bf16 (others are upcast to float32 or fail to run).

Under float32 the products are autodiff's, and ``einsum`` is the plain product -- except
where a caller asks for ``float32_layout`` (t2t's Dense layers do): then the same custom VJP
runs in float32, only for its layouts. Autodiff's kernel gradient x^T g contracts the token
dims, which are x's and g's leading dims; XLA:CPU then writes g transposed, recomputing the
activation's backward (GeLU's tanh polynomial) inside that transposing copy next to a
row-major copy for the input gradient, and runs the product on its generic dot kernel. Laid
out as here the gradient is one YNNPACK dot over row-major g: float32 train steps on an AMX
host took 1.07x (GPT-2 small), 1.27x (BERT-base) and 1.12x (T5.1.1-base) the CPU time with
autodiff's layouts (medians of 6 A/B pairs, benchmarks/README.md). The gradients are the
same sums in another order: equal to autodiff's to float32 rounding, not bit for bit.

Tied output embeddings (`Embed.attend`, logits = x E^T) take the float32 layouts too. Their
table gradient g^T x contracts the tokens, g's leading dim, and g [tokens, vocab] is the
largest array of a small model's step; float32 layouts are therefore chosen by the elements
they transpose (`fewest_elements_moved`): (x^T g)^T transposes x and the [d, vocab]
product, and XLA folds that output transpose into the dot. T5 micro's step (the ablation
grids') took 1.08x and GPT-2 small's 1.07x the CPU time keeping the output order (AVX2
host, medians of 8 and 6 A/B pairs, `benchmarks/ab_step.py --lever f32_layout_cost`).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def _explicit(spec: str, a_ndim: int, b_ndim: int) -> tuple[str, str, str]:
    """'...d,vd->...v' -> ('Ad', 'vd', 'Av'): '...' spelled out as upper-case letters."""
    ins, out = spec.replace(" ", "").split("->")
    a, b = ins.split(",")
    used = set(a + b + out)
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]

    def fill(s: str, ndim: int) -> str:
        if "..." not in s:
            return s
        n = ndim - (len(s) - 3)
        return s.replace("...", "".join(spare[:n]))

    n_ell = max(a_ndim - (len(a) - 3) if "..." in a else 0,
                b_ndim - (len(b) - 3) if "..." in b else 0)
    ell = "".join(spare[:n_ell])
    return fill(a, a_ndim), fill(b, b_ndim), out.replace("...", ell)


def _forward(spec: str, dtype, laid_out: bool, a: jax.Array, b: jax.Array):
    """(float32 product, its `dtype` operands): jnp.einsum's product, or with `laid_out` the
    explicit layout of `_product` (for specs whose einsum XLA:CPU cannot run in bf16)."""
    a_low, b_low = a.astype(dtype), b.astype(dtype)
    if laid_out:
        return _product(*_explicit(spec, a.ndim, b.ndim), a_low, b_low), (a_low, b_low)
    return jnp.einsum(spec, a_low, b_low, preferred_element_type=jnp.float32), (a_low, b_low)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _mixed(spec: str, dtype, a_dtype, b_dtype, laid_out: bool, a: jax.Array,
           b: jax.Array) -> jax.Array:
    return _forward(spec, dtype, laid_out, a, b)[0]


def _mixed_fwd(spec, dtype, a_dtype, b_dtype, laid_out, a, b):
    return _forward(spec, dtype, laid_out, a, b)   # residuals: what autodiff would keep


def _layouts(sx: str, sy: str, sz: str):
    """Every way to run einsum(sx,sy->sz) as lhs [B, M, K] x rhs [B, K, N] or [B, N, K]:
    ((output transposed?, operand transposes), y is lhs?, lhs order, rhs order, rhs [B, N, K]?,
    number of batch letters)."""
    batch = [c for c in sz if c in sx and c in sy]
    for swap in (False, True):
        sl, sr = (sy, sx) if swap else (sx, sy)
        free_l = [c for c in sl if c not in sr]
        free_r = [c for c in sr if c not in sl]
        contract = [c for c in sl if c in sr and c not in sz]
        # keep an operand's own order of its batch and contracted letters when it can
        for keep in (sl, sr):
            b = sorted(batch, key=keep.index)
            k = sorted(contract, key=keep.index)
            lhs = b + free_l + k
            turned = b + free_l + free_r != list(sz)             # the output needs a transpose
            for rhs, rhs_nt in ((b + k + free_r, False), (b + free_r + k, True)):
                moves = (list(sl) != lhs) + (list(sr) != rhs)
                yield (turned, moves), swap, lhs, rhs, rhs_nt, len(b)


def keep_output_order(c, operands, out_size: int) -> tuple:
    """Layout cost under bf16 (`_product`): an output in another order first, then operand
    moves, then the size of the first operand of the dot."""
    return c[0], operands[c[1]][1].size


def fewest_elements_moved(c, operands, out_size: int) -> tuple:
    """Layout cost under float32: the elements transposed -- the operands reordered, and the
    output when it comes out in another order. XLA folds that output transpose into the dot
    (a dot contracting its first operand's leading dim, which XLA:CPU runs in float32 on its
    generic kernel) rather than writing a large operand transposed (module docstring)."""
    (turned, _), swap, lhs, rhs = c[:4]
    (sl, l), (sr, r) = operands[::-1] if swap else operands
    moved = (l.size if list(sl) != lhs else 0) + (r.size if list(sr) != rhs else 0)
    return moved + (out_size if turned else 0), turned


FLOAT32_LAYOUT_COST = fewest_elements_moved   # benchmarks/ab_step.py swaps it for its B


def _product(sx: str, sy: str, sz: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """einsum(sx,sy->sz)(x, y), float32 result, as one [B, M, K] x [B, K, N] or [B, N, K]
    product (B absent without batch letters), with as few operand transposes as possible.

    XLA:CPU (jax 0.10.2) runs bf16 x bf16 -> float32 dots natively (YNNPACK) only in these
    forms. A dot whose first operand is contracted along a leading dim is upcast to
    float32 when XLA sees it early, and fails at run time ("Unsupported element type for
    DotThunk") when the algebraic simplifier creates it late -- which it does to remove a
    transpose of the output. So under bf16 the output order is kept wherever a layout
    allows it, then operand transposes are minimised (`keep_output_order`); under float32,
    which every dot form runs, the fewest elements are transposed
    (`fewest_elements_moved`).
    """
    size = {c: n for s, a in ((sx, x), (sy, y)) for c, n in zip(s, a.shape)}
    cost = (FLOAT32_LAYOUT_COST if x.dtype == y.dtype == jnp.float32
            else keep_output_order)
    out_size = int(np.prod([size[c] for c in sz]))
    operands = ((sx, x), (sy, y))
    moves, swap, lhs, rhs, rhs_nt, nb = min(
        _layouts(sx, sy, sz), key=lambda c: cost(c, operands, out_size))
    (sl, l), (sr, r) = operands[::-1] if swap else operands

    def flat(a, s, order, groups):   # transpose to `order`, then one dim per group
        if list(s) != order:
            a = jnp.transpose(a, [s.index(c) for c in order])
        dims, i = [], 0
        for n in groups:
            dims.append(int(np.prod([size[c] for c in order[i:i + n]])))
            i += n
        return a.reshape(dims)

    n_k = len([c for c in lhs[nb:] if c in sr])
    free_l, free_r = lhs[nb:len(lhs) - n_k], [c for c in rhs[nb:] if c not in sl]
    lead = [nb] if nb else []
    l3 = flat(l, sl, lhs, lead + [len(free_l), n_k])                        # [B?, M, K]
    r3 = flat(r, sr, rhs, lead + ([len(free_r), n_k] if rhs_nt else [n_k, len(free_r)]))
    b = 1 if nb else 0                                                      # flat batch dims
    contract = ((b + 1,), (b + 1 if rhs_nt else b,))
    z = lax.dot_general(l3, r3, (contract, ((0,), (0,)) if nb else ((), ())),
                        preferred_element_type=jnp.float32)                 # [B?, M, N]
    order = lhs[:nb] + free_l + free_r
    z = z.reshape([size[c] for c in order])
    return jnp.transpose(z, [order.index(c) for c in sz])


def _mixed_bwd(spec, dtype, a_dtype, b_dtype, laid_out, res, g):
    a_low, b_low = res
    sa, sb, sc = _explicit(spec, a_low.ndim, b_low.ndim)
    g = g.astype(dtype)
    da = _product(sc, sb, sa, g, b_low)
    db = _product(sa, sc, sb, a_low, g)
    return da.astype(a_dtype), db.astype(b_dtype)


_mixed.defvjp(_mixed_fwd, _mixed_bwd)


def _check(spec: str, a: jax.Array, b: jax.Array) -> None:
    """The backward einsums exist only when every operand index is in the other or the out."""
    sa, sb, sc = _explicit(spec, a.ndim, b.ndim)
    for name, s, other in (("first", sa, sb + sc), ("second", sb, sa + sc)):
        if len(set(s)) != len(s) or not set(s) <= set(other):
            raise ValueError(f"mixed einsum {spec!r}: the {name} operand has a repeated index or "
                             "one summed over that operand alone")


def einsum(spec: str, a: jax.Array, b: jax.Array, dtype, laid_out: bool = False,
           float32_layout: bool = False) -> jax.Array:
    """einsum(spec, a, b) with `dtype` operands and a float32 result.

    Under a float32 `dtype` this is the plain product (autodiff's backward) unless
    `float32_layout` asks for the laid-out backward products (module docstring); under
    bf16/float16 the backward products take `dtype` operands too, and
    `laid_out` lays the forward product out as the backward ones: for a spec whose output
    no single dot gives in order (e.g. 'bqhd,hdl->bhql', a batch index in the second place),
    which XLA:CPU's plain bf16 einsum fails to run.
    """
    if jnp.dtype(dtype) == jnp.float32 and not float32_layout:
        return jnp.einsum(spec, a.astype(dtype), b.astype(dtype),
                          preferred_element_type=jnp.float32)
    _check(spec, a, b)
    return _mixed(spec, jnp.dtype(dtype), a.dtype, b.dtype, laid_out, a, b)
