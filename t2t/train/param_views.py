"""T5's Adafactor sees each parameter as Mesh TensorFlow stored it.

Adafactor's statistics depend on a parameter's shape: it factors the second moment over
the two largest dimensions when both are at least ``min_dim_size_to_factor`` (128), and it
clips and scales each update by the RMS of the whole parameter. t2t stores attention
kernels as [d_model, heads, head_dim] (logical axes embed, heads, kv) and, with
``scan_layers``, every layer's parameters stacked as one [layers, ...] array. Mesh TF
(``combine_dims``), t5x (DenseGeneral's flattened kernel, and its Adafactor's layer axis as
a batch dimension) and Hugging Face keep a 2-D [d_model, heads * head_dim] kernel per layer.
Given as stored, optax's Adafactor would keep a full second moment for every attention
kernel (head_dim < 128: nothing to factor; 4.8B extra floats for T5.1.1-XXL) and clip and
scale a scanned stack by the RMS of all its layers at once.

:func:`per_parameter` runs an optax transformation on each parameter alone, in the view
its logical axes give (:func:`view_of`): adjacent ``heads`` and ``kv`` dimensions joined
into one and ``layers`` dimensions split off as independent parameters (``jax.vmap``). The
optimizer state mirrors the parameter tree, one inner state per parameter. A transformation
that needs the axes is returned unbound (every parameter as stored) with a
``with_param_axes`` method; the Trainer binds it once it knows the model's logical axes.
:func:`from_stored_shapes` carries a state written before the views (optax's Adafactor on
the stored shapes: checkpoints of earlier runs) over to them, exactly.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import optax
from optax._src.factorized import _factored_dims

PyTree = Any
Path = Tuple[Any, ...]
LAYERS = "layers"
JOINED = ("heads", "kv")


@dataclasses.dataclass(frozen=True)
class View:
    """One parameter as the optimizer sees it: `stacked` dims (scanned layers) moved first
    and flattened into one batch dim of independent parameters; dims `joined` and
    `joined + 1` (heads, kv) merged into one."""

    stacked: Tuple[int, ...] = ()
    joined: Optional[int] = None

    def rest(self, ndim: int) -> Tuple[int, ...]:
        return tuple(d for d in range(ndim) if d not in self.stacked)

    def shape(self, shape: Sequence[int]) -> Tuple[int, ...]:
        """The viewed shape: [prod(stacked)] (if any) + the rest, heads x kv joined."""
        out = []
        for d in self.rest(len(shape)):
            if self.joined is not None and d == self.joined + 1:
                out[-1] *= shape[d]
            else:
                out.append(shape[d])
        stacked = [math.prod(shape[d] for d in self.stacked)] if self.stacked else []
        return tuple(stacked + out)

    def to(self, x: jax.Array) -> jax.Array:
        perm = self.stacked + self.rest(x.ndim)
        return jnp.transpose(x, perm).reshape(self.shape(x.shape))

    def back(self, y: jax.Array, shape: Sequence[int]) -> jax.Array:
        perm = self.stacked + self.rest(len(shape))
        y = y.reshape(tuple(shape[d] for d in perm))
        return jnp.transpose(y, tuple(perm.index(d) for d in range(len(shape))))


def view_of(names: Sequence[Optional[str]]) -> Optional[View]:
    """The view of a parameter with logical axes `names`; None: as stored."""
    names = tuple(names)
    stacked = tuple(i for i, n in enumerate(names) if n == LAYERS)
    joined = next((i for i in range(len(names) - 1) if names[i:i + 2] == JOINED), None)
    if not stacked and joined is None:
        return None
    return View(stacked, joined)


def views_from_axes(axes: Dict[Path, Sequence[Optional[str]]]) -> Dict[Path, View]:
    """{parameter path: View} for the parameters whose logical axes change their view."""
    views = {path: view_of(names) for path, names in axes.items()}
    return {path: v for path, v in views.items() if v is not None}


def _apply(inner: optax.GradientTransformation, view: Optional[View]):
    """(init, update) of `inner` on one parameter through `view`."""
    if view is None:
        return inner.init, inner.update

    def init(p):
        y = view.to(p)
        return jax.vmap(inner.init)(y) if view.stacked else inner.init(y)

    def update(u, s, p):
        shape = u.shape
        u, p = view.to(u), None if p is None else view.to(p)
        if view.stacked:
            u, s = jax.vmap(inner.update, in_axes=(0, 0, None if p is None else 0))(u, s, p)
        else:
            u, s = inner.update(u, s, p)
        return view.back(u, shape), s

    return init, update


def _is_masked(x: Any) -> bool:
    return isinstance(x, optax.MaskedNode)


class NeedsParamAxes(optax.GradientTransformation):
    """A GradientTransformation that can be bound to the parameters' logical axes:
    ``tx.with_param_axes({path: names})`` (paths as ``jax.tree_util`` key paths)."""

    def with_param_axes(self, axes: Dict[Path, Sequence[Optional[str]]]):
        return self._bind(axes)          # set by the factory that built this transformation


def per_parameter(inner: optax.GradientTransformation,
                  views: Optional[Dict[Path, View]] = None) -> NeedsParamAxes:
    """`inner` (a transformation whose statistics are per leaf, e.g. optax.adafactor) run on
    each parameter alone in the view `views` gives it (by key path; others as stored).
    Frozen leaves (``optax.MaskedNode``) keep no state and get no update."""
    views = views or {}

    def init(params):
        def one(path, p):
            return p if _is_masked(p) else _apply(inner, views.get(path))[0](p)
        return jax.tree_util.tree_map_with_path(one, params, is_leaf=_is_masked)

    def update(updates, state, params=None):
        leaves, treedef = jax.tree_util.tree_flatten_with_path(updates, is_leaf=_is_masked)
        states = treedef.flatten_up_to(state)
        ps = treedef.flatten_up_to(params) if params is not None else [None] * len(leaves)
        new_u, new_s = [], []
        for (path, u), s, p in zip(leaves, states, ps):
            if not _is_masked(u):                  # a frozen leaf passes as it is
                u, s = _apply(inner, views.get(path))[1](u, s, p)
            new_u.append(u)
            new_s.append(s)
        return treedef.unflatten(new_u), treedef.unflatten(new_s)

    tx = NeedsParamAxes(init, update)
    tx._bind = lambda axes: per_parameter(inner, views_from_axes(axes))
    tx.inner, tx.views = inner, views
    return tx


def stored_shapes_tx(tx: optax.GradientTransformation) -> Optional[optax.GradientTransformation]:
    """The transformation `tx` runs per parameter, as it ran on the stored shapes before
    the views; None when `tx` is not a :func:`per_parameter` transformation."""
    return getattr(tx, "inner", None)


def from_stored_shapes(tx: NeedsParamAxes, stored: Any, params: PyTree) -> PyTree:
    """`tx`'s state carried over from `tx.inner`'s state on the stored shapes (optax's
    Adafactor: ``(FactoredState, stateless...)``), e.g. a checkpoint from before the views.

    Exact, because both keep exponential averages of the same squared gradients: a full
    second moment becomes the view's row and column means (a factored statistic is the
    mean of the full one), and factored statistics over the same axes carry as they are.
    Raises ValueError where a statistic cannot be carried (factored over other axes)."""
    head, rest = stored[0], stored[1:]
    if not isinstance(head, optax.FactoredState) or jax.tree.leaves(rest):
        raise ValueError("not an optax Adafactor state")
    by_path = {name: dict(jax.tree_util.tree_flatten_with_path(getattr(head, name))[0])
               for name in ("v_row", "v_col", "v")}

    def one(path, p):
        view = tx.views.get(path) or View()
        new = _apply(tx.inner, view)[0](p)
        stats = _carry(p.shape, view, by_path["v_row"][path], by_path["v_col"][path],
                       by_path["v"][path], new[0])
        count = jnp.broadcast_to(head.count, new[0].count.shape)
        return (new[0]._replace(count=count, **stats),) + tuple(new[1:])

    return jax.tree_util.tree_map_with_path(one, params)


def _carry(shape: Sequence[int], view: View, row, col, full, new: optax.FactoredState) -> dict:
    """The view's second-moment statistics from the stored shape's (`row`, `col`, `full`)."""
    off = 1 if view.stacked else 0                 # vmapped: statistics have a layer dim
    viewed = view.shape(shape)
    new_factored = tuple(new.v.shape) != viewed    # factored: v is a [1] (per layer) stub
    if tuple(full.shape) == tuple(shape):          # stored unfactored: the full average
        ema = view.to(full)
        if not new_factored:
            return {"v": ema}
        d1, d0 = _factored_dims(viewed[off:], True, 0)
        return {"v_row": ema.mean(axis=d0 + off), "v_col": ema.mean(axis=d1 + off)}
    if new_factored and view.joined is None and view.stacked in ((), (0,)):
        d1, d0 = _factored_dims(viewed[off:], True, 0)
        if _factored_dims(tuple(shape), True, 0) == (d1 + off, d0 + off):
            return {"v_row": row, "v_col": col}    # the same axes, the same layer order
    raise ValueError(f"the factored statistics of a {tuple(shape)} parameter do not carry "
                     f"over to its view {viewed}")


def bind_param_axes(tx: optax.GradientTransformation,
                    axes: Dict[Path, Sequence[Optional[str]]]) -> optax.GradientTransformation:
    """`tx` bound to the parameters' logical axes if it wants them; else `tx` itself."""
    bind: Optional[Callable] = getattr(tx, "with_param_axes", None)
    return bind(axes) if bind is not None else tx

