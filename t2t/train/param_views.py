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
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import optax

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
            if _is_masked(u):
                new_u.append(u)
                new_s.append(s)
                continue
            u, s = _apply(inner, views.get(path))[1](u, s, p)
            new_u.append(u)
            new_s.append(s)
        return treedef.unflatten(new_u), treedef.unflatten(new_s)

    tx = NeedsParamAxes(init, update)
    tx._bind = lambda axes: per_parameter(inner, views_from_axes(axes))
    return tx


def bind_param_axes(tx: optax.GradientTransformation,
                    axes: Dict[Path, Sequence[Optional[str]]]) -> optax.GradientTransformation:
    """`tx` bound to the parameters' logical axes if it wants them; else `tx` itself."""
    bind: Optional[Callable] = getattr(tx, "with_param_axes", None)
    return bind(axes) if bind is not None else tx

