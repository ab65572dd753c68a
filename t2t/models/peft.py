"""Parameter-efficient fine-tuning around any `Model`, without touching `t2t.nn`.

* LoRA (Hu et al. 2021) is a parameter transform: `merge_lora(base, lora, scale)` returns
  `W + scale · A @ B` reshaped to each target kernel's n-d shape, and `LoraModel` trains only
  the factors (and optionally some head modules) while the base parameters stay frozen.
* Prompt tuning (Lester et al. 2021) prepends `n` learned embeddings to a stack's input
  embeddings through a flax method interceptor (`nn.intercept_methods`); the stack sees `n`
  extra slots, its output drops them again, so heads and losses see the original length.
* Frozen parameters live outside the optimizer: the wrappers hold them as constants
  (`base_params`), and `freeze` keeps in-tree frozen leaves stateless.
  `optimizer_state_bytes` measures what that saves (via `jax.eval_shape`, no allocation).

The in-tree methods for fine-tuning runs (`t2t.models.lightweight`: LoRA, prompt, prefix,
adapters) keep the whole tree in the train state and freeze it with `freeze`.
"""
from __future__ import annotations

import contextlib
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
from t2t.models.base import Batch, Model
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


class ViewForwarding:
    """The Model contract forwarded to `self.view` (a base model whose module takes the
    wrapper's parameter tree); the loss weight is the base model's."""

    def apply(self, params, batch: Batch, rng: Optional[jax.Array] = None, **kwargs):
        return self.view.apply(params, batch, rng, **kwargs)

    def loss_fn(self, params, batch: Batch, rng: Optional[jax.Array] = None):
        return self.view.loss_fn(params, batch, rng)

    def loss_weight(self, batch: Batch) -> jax.Array:
        return self.base_model.loss_weight(batch)

    def score(self, params, batch: Batch) -> jax.Array:
        return self.view.score(params, batch)

    def predict(self, params, batch: Batch, **options):
        return self.view.predict(params, batch, **options)


class _FrozenBase(ViewForwarding, Model):
    """A wrapper whose trainable tree is small and whose base parameters are frozen
    constants (never in the optimizer state). Delegates the contract to `base_model`."""

    def __init__(self, base_model: Model, base_params: Params,
                 train_modules: Sequence[str] = ()):
        super().__init__(base_model.config, base_model.module, base_model.loss)
        self.base_model = base_model
        self.family = base_model.family
        self.input_features = base_model.input_features
        # Host (numpy) leaves go to the device once; jax arrays keep their sharding. Under
        # jit the frozen tree is a closed-over constant, which JAX passes as an argument.
        self.base_params = jax.tree_util.tree_map(
            lambda x: jnp.asarray(x) if isinstance(x, np.ndarray) else x, plain(base_params))
        missing = [m for m in train_modules if m not in self.base_params]
        if missing:
            raise ValueError(f"train_modules {missing} are not top-level modules of the base "
                             f"params {sorted(self.base_params)}")
        self.train_modules = tuple(train_modules)

    def _trained_init(self) -> Dict[str, Params]:
        return {m: self.base_params[m] for m in self.train_modules}

    def full_params(self, trainable: Params) -> Params:
        """The complete parameter tree the base model runs with."""
        params = dict(self.base_params)
        params.update(trainable.get("modules", {}))
        return params

    def _context(self, trainable: Params):
        return contextlib.nullcontext()

    def _bridge(self) -> "Bridge":
        return Bridge(self.base_model.module, self.full_params, self._context)

    @property
    def view(self) -> Model:
        """The base model whose module takes the *trainable* tree (`bridged`)."""
        if getattr(self, "_view", None) is None:
            self._view = bridged(self.base_model, self._bridge())
        return self._view



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


class PromptBridge(Bridge):
    """Prompt tuning's bridge. For a prompted Decoder (`fills`), the call that creates the
    KV cache is followed by one that writes the prompts' keys and values into its first
    slots, so the prefill and every step find them there."""

    def __init__(self, module: nn.Module, to_base: Callable, prompt_of: Callable,
                 stack: Optional[Path], fills: bool):
        super().__init__(module, to_base, self._context)
        self.prompt_of, self.stack, self.fills = prompt_of, stack, fills

    def _context(self, params, fill: bool = False):
        return nn.intercept_methods(_PromptInterceptor(self.prompt_of(params), self.stack,
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


def bridged(base_model: Model, bridge: Bridge) -> Model:
    """A shallow copy of `base_model` whose methods take the wrapper's parameter tree: its
    module is `bridge`. Make one per wrapper (jit caches by its identity)."""
    view = copy.copy(base_model)
    view.module = bridge
    return view


class LoraModel(_FrozenBase):
    """LoRA around any Model: trainable `{"lora": factors, "modules": {name: subtree}}`,
    where `modules` (from `train_modules`, e.g. ("classifier",)) are trained in full.
    `loss_fn(trainable, batch, rng)` runs the base loss on `merged_params(trainable)`."""

    def __init__(self, base_model: Model, rank: int = 8, alpha: float = 16.0,
                 targets: Sequence[str] = ("query", "value"), *, base_params: Params,
                 train_modules: Sequence[str] = (), init_stddev: Optional[float] = None):
        super().__init__(base_model, base_params, train_modules)
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.rank, self.alpha, self.targets = rank, alpha, tuple(targets)
        self.scale = alpha / rank
        self.init_stddev = init_stddev
        if not lora_targets(self.base_params, self.targets):
            raise ValueError(f"no kernels named {self.targets} in the base params")

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        trainable = {"lora": init_lora(rng, self.base_params, self.targets, self.rank,
                                       self.init_stddev)}
        if self.train_modules:
            trainable["modules"] = self._trained_init()
        return trainable

    def full_params(self, trainable: Params) -> Params:
        """Base params with the LoRA deltas merged (and trained modules swapped in); also
        what to export or serve once training is done."""
        merged = merge_lora(self.base_params, trainable["lora"], self.scale)
        merged.update(trainable.get("modules", {}))
        return merged

    merged_params = full_params


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


class _PromptInterceptor:
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


class PromptTuningModel(_FrozenBase):
    """Prompt tuning: `num_prompts` learned embeddings [num_prompts, E] before the token
    embeddings of one stack (`stack`: a module path such as ("encoder",); None = the first
    Encoder/Decoder the model calls: BERT's and T5's encoder, GPT's decoder). Position and
    type embeddings, norms and dropout then apply as to any token. The stack's output drops
    the prompt slots, so heads, losses and features keep their lengths (in T5 the decoder
    therefore reads the prompts only through the encoder states of real tokens).

    Trainable: `{"prompt": [n, E], "modules": {...}}` (`train_modules`, e.g. a new head).
    Rows should be unpacked: the prompts join each row's first segment. `init="vocab"`
    starts the prompts from random rows of the token table (Lester et al.), "normal" from
    N(0, 0.02²). Decoder-only `predict` decodes on the KV cache, the prompts cached first.
    """

    def __init__(self, base_model: Model, num_prompts: int, *, base_params: Params,
                 stack: Optional[Path] = None, init: str = "vocab",
                 train_modules: Sequence[str] = ()):
        super().__init__(base_model, base_params, train_modules)
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        if init not in ("vocab", "normal"):
            raise ValueError(f"init must be 'vocab' or 'normal', got {init!r}")
        self.num_prompts, self.init_method = num_prompts, init
        self.stack = prompt_stack(base_model, stack)
        tables = [v for p, v in traverse_util.flatten_dict(self.base_params).items()
                  if p[-2:] == ("token_embedder", "embedding")]
        if not tables:
            raise ValueError("the base params have no token_embedder/embedding table")
        self.table = tables[0]                                  # [vocab, E]

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        n, (vocab, width) = self.num_prompts, self.table.shape
        if self.init_method == "vocab":
            rows = jax.random.randint(rng, (n,), 0, vocab)
            prompt = jnp.asarray(self.table, jnp.float32)[rows]
        else:
            prompt = 0.02 * jax.random.normal(rng, (n, width), jnp.float32)
        trainable = {"prompt": prompt}
        if self.train_modules:
            trainable["modules"] = self._trained_init()
        return trainable

    def _bridge(self) -> Bridge:
        return PromptBridge(self.base_model.module, self.full_params, lambda t: t["prompt"],
                            self.stack, fills=prompt_fills_cache(self))


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
    checkpoint). For trees
    that keep frozen parts in-tree (fine-tuning runs, checkpoint compatibility); the
    `_FrozenBase` wrappers keep them out of the tree altogether.
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
