"""Building blocks of parameter-efficient fine-tuning, on parameter trees and flax modules.

The `Model` wrappers that use them (LoRA, prompt, prefix and adapter tuning for
`t2t finetune`) are in `t2t.models.lightweight`; this module holds what they are made of:

* LoRA (Hu et al. 2021) as a parameter transform: `init_lora` gives factors A, B for each
  target kernel (`KERNEL_LAYOUTS`: which dims are the input, also under `scan_layers`), and
  `merge_lora(base, lora, scale)` returns `W + scale · A @ B` reshaped to the kernel's shape.
* Prompt tuning (Lester et al. 2021): `PromptInterceptor` prepends `n` learned embeddings
  to one stack's token embeddings through a flax method interceptor (`nn.intercept_methods`);
  the stack sees `n` extra slots and its output drops them again, so heads and losses see
  the original length. `PromptBridge` runs a module under it (and fills a decoder's KV
  cache with the prompts first); `bridged` gives a model whose module is such a bridge.
* Frozen leaves outside the optimizer: `freeze(tx, frozen)` gives them no update and no
  optimizer state; `optimizer_state_bytes` measures what that saves (via `jax.eval_shape`,
  no allocation), `tree_bytes` any tree's size.
"""
from __future__ import annotations

import copy
import inspect
import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util

from t2t.models import families
from t2t.models.base import Model
from t2t.nn.embed import Embed
from t2t.nn.stacks import Decoder, Encoder

Params = Any
Path = Tuple[str, ...]

ATTENTION_TARGETS = ("query", "key", "value", "out")
MLP_TARGETS = ("wi", "wi_0", "wi_1", "wo")
# Kernel name -> (leading dims contracted with the input, ndim of one layer's kernel):
# query/key/value [embed, heads, head_dim], out [heads, head_dim, embed], MLP [in, out].
KERNEL_LAYOUTS: Dict[str, Tuple[int, int]] = {
    "query": (1, 3), "key": (1, 3), "value": (1, 3), "out": (2, 3),
    "wi": (1, 2), "wi_0": (1, 2), "wi_1": (1, 2), "wo": (1, 2)}


def plain(params: Params) -> Params:
    """`params` without logical-axis boxes or a {"params": ...} wrapper."""
    params = nn.unbox(params)
    if isinstance(params, dict) and set(params) == {"params"}:
        params = params["params"]
    return params


# ----------------------------------------------------------------------------- LoRA
def lora_targets(params: Params, targets: Sequence[str]) -> Dict[Path, Tuple[int, int, int]]:
    """Module paths whose `kernel` LoRA adapts -> (lead, fan_in, fan_out).

    `lead` counts stacked leading axes (the layer axis under `scan_layers`); fan_in is the
    product of the first `contract` kernel dims after them, fan_out the product of the rest.
    """
    unknown = [t for t in targets if t not in KERNEL_LAYOUTS]
    if unknown:
        raise ValueError(f"unknown LoRA targets {unknown}; choose from {sorted(KERNEL_LAYOUTS)}")
    found = {}
    for path, leaf in traverse_util.flatten_dict(plain(params)).items():
        if len(path) < 2 or path[-1] != "kernel" or path[-2] not in targets:
            continue
        contract, ndim = KERNEL_LAYOUTS[path[-2]]
        lead = len(leaf.shape) - ndim
        if lead < 0:
            raise ValueError(f"{'/'.join(path)} has shape {leaf.shape}; a {path[-2]} kernel "
                             f"has {ndim} dims")
        fan_in = math.prod(leaf.shape[lead:lead + contract])
        fan_out = math.prod(leaf.shape[lead + contract:])
        found[path[:-1]] = (lead, fan_in, fan_out)
    return found


def init_lora(rng: jax.Array, params: Params, targets: Sequence[str], rank: int,
              stddev: Optional[float] = None) -> Params:
    """LoRA factors for every target kernel, nested like `params`:
    `{..., "query": {"lora_a": [*lead, in, rank], "lora_b": [*lead, rank, out]}}`.
    A ~ N(0, stddev²) (default 1/sqrt(in)), B = 0, so the adapted model starts as the base.
    """
    found = lora_targets(params, targets)
    if not found:
        raise ValueError(f"no kernels named {tuple(targets)} in the parameters")
    kernels = traverse_util.flatten_dict(plain(params))
    items = sorted(found.items())
    shapes = [tuple(kernels[path + ("kernel",)].shape[:lead]) + (fan_in, rank)
              for path, (lead, fan_in, _) in items]
    # One draw for all A factors (one RNG kernel to compile, not one per target).
    noise = jax.random.normal(rng, (sum(math.prod(s) for s in shapes),), jnp.float32)
    flat, offset = {}, 0
    for (path, (lead, fan_in, fan_out)), shape in zip(items, shapes):
        size = math.prod(shape)
        std = fan_in ** -0.5 if stddev is None else stddev
        flat[path + ("lora_a",)] = std * noise[offset:offset + size].reshape(shape)
        flat[path + ("lora_b",)] = jnp.zeros(shape[:-2] + (rank, fan_out), jnp.float32)
        offset += size
    return traverse_util.unflatten_dict(flat)


def lora_delta(a: jax.Array, b: jax.Array, kernel_shape: Sequence[int]) -> jax.Array:
    """A [*lead, in, r] @ B [*lead, r, out] -> the kernel's n-d shape. Row-major reshape:
    [*lead, in, out] is exactly [*lead, *in_dims, *out_dims] flattened twice."""
    return jnp.einsum("...ir,...ro->...io", a.astype(jnp.float32),
                      b.astype(jnp.float32)).reshape(kernel_shape)


def merge_lora(params: Params, lora: Params, scale: float) -> Params:
    """Base params with each adapted kernel replaced by `W + scale · A @ B` (W's dtype)."""
    flat = dict(traverse_util.flatten_dict(plain(params)))
    for path, leaf in traverse_util.flatten_dict(lora).items():
        if path[-1] != "lora_a":
            continue
        module = path[:-1]
        kernel_path = module + ("kernel",)
        if kernel_path not in flat:
            raise KeyError(f"LoRA factors for {'/'.join(module)}, which has no kernel")
        w = flat[kernel_path]
        delta = lora_delta(leaf, _at(lora, module)["lora_b"], w.shape)
        flat[kernel_path] = (jnp.asarray(w, jnp.float32) + scale * delta).astype(w.dtype)
    return traverse_util.unflatten_dict(flat)


def _at(tree: Params, path: Path) -> Any:
    for key in path:
        tree = tree[key]
    return tree


# ----------------------------------------------------------------------------- bridges
class Bridge:
    """A stand-in for a flax module: `apply({"params": p, ...})` runs the real module on
    `to_base(p)` inside `context(p)`. Decoding jits over its model (a static argument), so
    what the context closes over must come from `p`, never from a Python-side value."""

    def __init__(self, module: nn.Module, to_base: Callable, context: Callable):
        self.module, self.to_base, self.context = module, to_base, context

    def apply(self, variables, *args, **kwargs):
        params = variables["params"]
        with self.context(params):
            return self.module.apply({**variables, "params": self.to_base(params)},
                                     *args, **kwargs)


def bridged(base_model: Model, bridge: Bridge) -> Model:
    """A shallow copy of `base_model` whose methods take the wrapper's parameter tree: its
    module is `bridge`. Make one per wrapper (jit caches by its identity)."""
    view = copy.copy(base_model)
    view.module = bridge
    return view


# ----------------------------------------------------------------------------- prompts
_STACK_ARGS = {  # (tokens, segment ids, positions, token types, causal-attention flags)
    Encoder: ("input_tokens", "segment_ids", "positions", "token_type_ids", None),
    Decoder: ("decoder_input_tokens", "decoder_segment_ids", "decoder_positions", None,
              "decoder_causal_attention"),
}


def _prepend(x: jax.Array, n: int, value) -> jax.Array:
    """[..., length] -> [..., n + length] with `value` ([..., 1] or scalar) in front."""
    head = jnp.broadcast_to(jnp.asarray(value, x.dtype), x.shape[:-1] + (n,))
    return jnp.concatenate([head, x], axis=-1)


class PromptInterceptor:
    """Prepends `prompt` [n, E] to the token embeddings of one stack (`stack` path; None:
    the first Encoder/Decoder called) and drops those slots from the stack's output."""

    def __init__(self, prompt: jax.Array, stack: Optional[Path], fill: bool = False):
        self.prompt, self.stack, self.fill = prompt, stack, fill
        self.n = prompt.shape[0]
        self.active = False

    def __call__(self, next_fun, args, kwargs, context):
        module = context.module
        if context.method_name != "__call__":
            return next_fun(*args, **kwargs)
        if self.active and isinstance(module, Embed) and module.name == "token_embedder":
            out = next_fun(*args, **kwargs)                      # [..., n + length, E]
            prompt = jnp.broadcast_to(self.prompt.astype(out.dtype),
                                      out.shape[:-2] + self.prompt.shape)
            return jnp.concatenate([prompt, out[..., self.n:, :]], axis=-2)
        kind = next((k for k in _STACK_ARGS if type(module) is k), None)
        if kind is None or self.active:
            return next_fun(*args, **kwargs)
        path = tuple(module.scope.path)
        if self.stack is None:
            self.stack = path
        if path != self.stack:
            return next_fun(*args, **kwargs)
        return self._call_stack(kind, next_fun, args, kwargs, context)

    def _call_stack(self, kind, next_fun, args, kwargs, context):
        bound = inspect.signature(context.orig_method).bind(*args, **kwargs)
        a = bound.arguments
        if a.get("decode", False):
            return self._call_decoding(next_fun, bound, context)
        n = self.n
        tokens, segments, positions, types, causal = _STACK_ARGS[kind]
        a[tokens] = _prepend(a[tokens], n, 0)                  # placeholder ids
        if a.get(segments) is not None:   # prompts join each row's first segment
            a[segments] = _prepend(a[segments], n, a[segments][..., :1])
        if a.get(positions) is not None:
            a[positions] = jnp.concatenate(
                [jnp.broadcast_to(jnp.arange(n, dtype=a[positions].dtype),
                                  a[positions].shape[:-1] + (n,)), a[positions] + n], axis=-1)
        if types and a.get(types) is not None:
            a[types] = _prepend(a[types], n, 0)
        if causal and a.get(causal) is not None:
            # Prompts stay causal (flag 0): they precede the inputs and never read them, so
            # their keys and values are the same for every row (what decoding caches).
            a[causal] = _prepend(a[causal], n, 0)
        return self._run(next_fun, bound)[:, n:]

    def _run(self, next_fun, bound):
        self.active = True
        try:
            return next_fun(*bound.args, **bound.kwargs)       # [batch, n + length, ...]
        finally:
            self.active = False

    def _call_decoding(self, next_fun, bound, context):
        """A Decoder on the KV cache: creating it gives n more slots; the `fill` call (see
        `PromptBridge`) feeds the n prompts into slots 0..n-1 (positions 0..n-1, causal);
        later calls (prefill, steps) find them there, their explicit positions shifted by n."""
        a, n = bound.arguments, self.n
        if self.fill:
            return self._run(next_fun, bound)
        if context.module.has_variable("cache", "index"):
            if a.get("decoder_positions") is not None:
                a["decoder_positions"] = a["decoder_positions"] + n
            return next_fun(*bound.args, **bound.kwargs)
        a["decoder_input_tokens"] = _prepend(a["decoder_input_tokens"], n, 0)
        return self._run(next_fun, bound)[:, n:]                # sizes the cache


class PromptBridge(Bridge):
    """Prompt tuning's bridge. For a prompted Decoder (`fills`), the call that creates the
    KV cache is followed by one that writes the prompts' keys and values into its first
    slots, so the prefill and every step find them there."""

    def __init__(self, module: nn.Module, to_base: Callable, prompt_of: Callable,
                 stack: Optional[Path], fills: bool):
        super().__init__(module, to_base, self._context)
        self.prompt_of, self.stack, self.fills = prompt_of, stack, fills

    def _context(self, params, fill: bool = False):
        return nn.intercept_methods(PromptInterceptor(self.prompt_of(params), self.stack,
                                                      fill=fill))

    def apply(self, variables, *args, **kwargs):
        out = super().apply(variables, *args, **kwargs)
        if not (self.fills and kwargs.get("decode") and "cache" not in variables):
            return out
        params = variables["params"]
        tokens = args[0] if args else kwargs["decoder_input_tokens"]
        n = self.prompt_of(params).shape[0]
        with self._context(params, fill=True):
            _, state = self.module.apply(
                {**variables, "params": self.to_base(params), "cache": out[1]["cache"]},
                jnp.zeros(tokens.shape[:1] + (n,), jnp.int32), decode=True, mutable=["cache"])
        return out[0], state


def prompt_stack(base_model: Model, stack: Optional[Path]) -> Optional[Path]:
    """The prompted stack: the family's (T5's encoder, never its decoder), else the first
    one called."""
    if stack is None:
        how = families.get(base_model.family).decoding
        return None if how is None else how.prompt_stack
    return tuple(stack)


def prompt_fills_cache(model: Model) -> bool:
    """Whether a prompt fills the KV cache before decoding (decoder-only families)."""
    how = families.get(model.family).decoding
    return how is not None and how.continues_prompt


# ----------------------------------------------------------------------------- optimizer
def tree_bytes(tree: Any) -> int:
    """Bytes of all array leaves (arrays or ShapeDtypeStructs)."""
    return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                   for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "shape")))


def optimizer_state_bytes(tx: optax.GradientTransformation, params: Any) -> int:
    """Bytes of `tx.init(params)`, measured by `jax.eval_shape` (nothing is allocated).
    `params` may be arrays or ShapeDtypeStructs (e.g. `jax.eval_shape(model.init, ...)`)."""
    abstract = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      nn.unbox(params))
    return tree_bytes(jax.eval_shape(tx.init, abstract))


def freeze(tx: optax.GradientTransformation,
           frozen: Union[Sequence[str], Callable[[str], bool]]) -> optax.GradientTransformation:
    """`tx` on the trainable leaves; frozen leaves get zero updates and no optimizer state.

    `frozen`: top-level module names (e.g. ("token_embedder", "encoder")) or a predicate on
    the '/'-joined parameter path. `tx` sees the tree with frozen leaves as
    `optax.MaskedNode()` (empty nodes: the structure and paths kept, so path-based masks
    such as weight-decay masks still apply, the moments of trainable leaves keep their
    parameters' shardings, and the state holds no zero-size arrays, which orbax refuses to
    checkpoint). The whole tree stays in the train state, so checkpoints keep their layout
    (`t2t finetune` with a `t2t.models.lightweight` method passes `model.is_frozen`).
    """
    if callable(frozen):
        is_frozen = frozen
    else:
        names = tuple(frozen)
        is_frozen = lambda path: path.split("/")[0] in names  # noqa: E731

    def trainable(tree):   # frozen leaves -> empty nodes: same paths, no state
        def one(path, x):
            name = jax.tree_util.keystr(path, simple=True, separator="/")
            return optax.MaskedNode() if path and is_frozen(name) else x
        return jax.tree_util.tree_map_with_path(one, tree)

    def init_fn(params):
        return tx.init(trainable(params))

    def update_fn(updates, state, params=None):
        sub, state = tx.update(trainable(updates), state,
                               None if params is None else trainable(params))
        return jax.tree.map(lambda u, s: jnp.zeros_like(u) if isinstance(s, optax.MaskedNode)
                            else s, updates, sub), state

    if getattr(tx, "with_param_axes", None) is None:
        return optax.GradientTransformation(init_fn, update_fn)
    # `tx` wants the parameters' logical axes (t2t.train.param_views: T5's Adafactor): so
    # does the frozen one, binding `tx` and freezing the bound transformation.
    frozen_tx = type(tx)(init_fn, update_fn)
    frozen_tx._bind = lambda axes: freeze(tx.with_param_axes(axes), frozen)
    return frozen_tx
