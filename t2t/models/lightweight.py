"""Lightweight fine-tuning for `t2t finetune`: LoRA, prompt tuning, prefix tuning, adapters.

The one implementation of these methods in t2t (their building blocks, LoRA's merge, the
prompt interceptor and `freeze`, are in `t2t.models.peft`). Each wraps any `Model` and keeps
the *whole* parameter tree in the train state (so checkpoints, resume, `t2t eval` and
`t2t infer` work unchanged); `is_frozen(path)` tells `peft.freeze` which leaves get no
update and no optimizer state. `wrap(model)` picks the method (from gin in `t2t finetune`:
`wrap.method = 'prefix'`; configs/runs/peft_*.gin).

* LoRA (Hu et al. 2021): `{"lora": factors}` beside the base tree, merged as W + (α/r)·A·B.
* Prompt tuning (Lester et al. 2021): `{"prompt": [n, E]}`, prepended to one stack's input.
* Prefix tuning (Li & Liang 2021): learned keys/values before every self-attention's
  (`TransformerConfig.prefix_length`), reparameterised in training as P = MLP(P'): an
  embedding P' [p, d_model], Linear(d_model, k) -> tanh -> Linear(k, 2·L·h·d_h) giving
  every layer's keys and values at once; `drop_reparameterization` keeps only P.
* Adapters (Houlsby et al. 2019): `TransformerConfig.adapter_size` bottlenecks after each
  layer's attention and feed-forward; the adapters and every layer norm train.

Heads that the pretrained checkpoint lacks (a classifier's `pooler`, `classifier`) train in
every method, as in the papers' GLUE experiments; `train_modules` names the trained
top-level modules instead (e.g. () for the method's parameters alone).
"""
from __future__ import annotations

import contextlib
import copy
import math
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from t2t.errors import ConfigError
from t2t.models import peft
from t2t.models.base import Batch, Model

Params = Any
Path = Tuple[str, ...]
PREFIX_SLOTS = ("prefix_key", "prefix_value")


def _flat(tree: Params) -> Dict[Path, Any]:
    return traverse_util.flatten_dict(peft.plain(tree))


def with_config(model: Model, config) -> Model:
    """A copy of `model` whose config (and its module's) is `config`."""
    if not hasattr(model.module, "config"):
        raise ValueError(f"{type(model).__name__}'s module has no `config` field to adapt")
    out = copy.copy(model)
    out.config, out.module = config, model.module.clone(config=config)
    return out


def head_modules(model: Model, params: Params) -> Tuple[str, ...]:
    """Top-level modules a pretrained trunk does not provide (they train in every method)."""
    trunk = getattr(model, "required_modules", None)
    if trunk is None:
        return ()
    return tuple(k for k in peft.plain(params) if k not in trunk)


class Lightweight(Model):
    """Base: `params` = the adapted base model's tree plus the method's own entries. The
    Model contract runs on `view`: the adapted base model whose module (a `peft.Bridge`)
    takes this tree and runs the base module on `to_base(params)`."""

    extra_keys: Tuple[str, ...] = ()

    def __init__(self, base_model: Model, train_modules: Optional[Sequence[str]] = None):
        self.original = base_model
        self.base_model = with_config(base_model, self.adapt_config(base_model.config))
        super().__init__(self.base_model.config, self.base_model.module, self.base_model.loss)
        self.family = base_model.family
        self.input_features = base_model.input_features
        self.train_modules = None if train_modules is None else tuple(train_modules)
        self._heads: Optional[Tuple[str, ...]] = None      # found by `init`
        self.view = peft.bridged(self.base_model, self.bridge())

    # ----------------------------------------------------------- what a method defines
    def adapt_config(self, config):
        return config

    def init_extra(self, rng: jax.Array, base: Params) -> Dict[str, Any]:
        """The method's own entries for a base tree (unboxed)."""
        return {}

    def to_base(self, params: Params) -> Params:
        """The tree the adapted base model runs with."""
        return {k: v for k, v in params.items() if k not in self.extra_keys}

    def bridge(self) -> peft.Bridge:
        return peft.Bridge(self.base_model.module, self.to_base,
                           lambda _: contextlib.nullcontext())

    def method_trainable(self, path: Path) -> bool:
        raise NotImplementedError

    # ----------------------------------------------------------- the Model contract
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

    def is_frozen(self, path: str) -> bool:
        """'/'-joined parameter path -> True for the leaves that must not move."""
        parts = tuple(path.split("/"))
        heads = self.train_modules if self.train_modules is not None else self._heads
        if heads is None:
            raise RuntimeError("call init (or init_from_pretrained) before is_frozen")
        return not (parts[0] in heads or self.method_trainable(parts))

    def trainable_count(self, params: Params) -> int:
        return sum(int(x.size) for p, x in _flat(params).items()
                   if not self.is_frozen("/".join(p)))

    def init(self, rng: jax.Array, batch: Batch) -> Params:
        base = self.base_model.init(rng, batch)
        return self._finish(jax.random.fold_in(rng, 1), base)

    def _finish(self, rng, base: Params) -> Params:
        self._heads = head_modules(self.original, base)
        missing = [m for m in self.train_modules or () if m not in peft.plain(base)]
        if missing:
            raise ConfigError(
                f"{type(self).__name__}.train_modules names {missing}, which are not top-level "
                f"modules of the model; choose from {sorted(peft.plain(base))}")
        base = self.strip_base(base)
        return {**base, **self.init_extra(rng, nn.unbox(base))}

    def strip_base(self, base: Params) -> Params:
        return base

    def init_from_pretrained(self, rng: jax.Array, batch: Batch, pretrained: Params) -> Params:
        """The original model's pretrained tree (its own `init_from_pretrained` when it has
        one, else `pretrained` as it is) copied into a fresh tree of this model."""
        from t2t.models.classifiers import merge_pretrained
        if hasattr(self.original, "init_from_pretrained"):
            loaded = self.original.init_from_pretrained(rng, batch, pretrained)
        else:
            loaded = peft.plain(pretrained)
        fresh = nn.unbox(self.init(rng, batch))
        return merge_pretrained(fresh, nn.unbox(loaded))[0]

    def __getattr__(self, name):      # model-specific helpers (e.g. a tagger's weights)
        if name in ("original", "base_model", "view", "_heads"):
            raise AttributeError(name)
        return getattr(self.view, name)


class LoraTuning(Lightweight):
    """LoRA factors on the `targets` kernels: r·(fan_in + fan_out) trainable per kernel."""

    extra_keys = ("lora",)

    def __init__(self, base_model: Model, rank: int = 8, alpha: float = 16.0,
                 targets: Sequence[str] = ("query", "value"),
                 train_modules: Optional[Sequence[str]] = None):
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.rank, self.alpha, self.targets = rank, alpha, tuple(targets)
        super().__init__(base_model, train_modules)

    def init_extra(self, rng, base):
        return {"lora": peft.init_lora(rng, base, self.targets, self.rank)}

    def to_base(self, params):
        return peft.merge_lora(super().to_base(params), params["lora"], self.alpha / self.rank)

    def method_trainable(self, path):
        return path[0] == "lora"


class PromptTuning(Lightweight):
    """`num_prompts` learned embeddings [n, E] (n·E trainable) before the token embeddings
    of one stack (`stack`: a module path such as ("encoder",); None = the family's, else the
    first Encoder/Decoder the model calls: BERT's and T5's encoder, GPT's decoder). Position
    and type embeddings, norms and dropout then apply as to any token. The stack's output
    drops the prompt slots, so heads, losses and features keep their lengths (in T5 the
    decoder therefore reads the prompts only through the encoder states of real tokens).

    Rows should be unpacked: the prompts join each row's first segment. `init="vocab"`
    starts the prompts from random rows of the token table (Lester et al.), "normal" from
    N(0, 0.02²). Decoder-only `predict` decodes on the KV cache, the prompts cached first.
    """

    extra_keys = ("prompt",)

    def __init__(self, base_model: Model, num_prompts: int = 20, init: str = "vocab",
                 stack: Optional[Path] = None, train_modules: Optional[Sequence[str]] = None):
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        if init not in ("vocab", "normal"):
            raise ValueError(f"PromptTuning.init must be 'vocab' or 'normal', got {init!r}")
        self.num_prompts, self.init_method = num_prompts, init
        self.stack = peft.prompt_stack(base_model, stack)
        super().__init__(base_model, train_modules)

    def init_extra(self, rng, base):
        table = next((v for p, v in _flat(base).items()
                      if p[-2:] == ("token_embedder", "embedding")), None)
        if table is None:
            raise ValueError("prompt tuning needs a token_embedder/embedding table")
        n, (vocab, width) = self.num_prompts, table.shape
        if self.init_method == "vocab":
            rows = jax.random.randint(rng, (n,), 0, vocab)
            return {"prompt": jnp.asarray(table, jnp.float32)[rows]}
        return {"prompt": 0.02 * jax.random.normal(rng, (n, width), jnp.float32)}

    def bridge(self):
        return peft.PromptBridge(self.base_model.module, self.to_base, lambda p: p["prompt"],
                                 self.stack, fills=peft.prompt_fills_cache(self))

    def method_trainable(self, path):
        return path[0] == "prompt"


class PrefixTuning(Lightweight):
    """Prefix tuning: `prefix_length` key/value slots in every self-attention. With
    `reparameterize` (training, as Li & Liang) they are MLP(P') and only P' and the MLP
    train; `drop_reparameterization` turns a trained tree into one holding P alone, which
    `reparameterize=False` (or the base model with `prefix_length`) runs directly."""

    extra_keys = ("prefix_mlp",)

    def __init__(self, base_model: Model, prefix_length: int = 10, hidden: int = 512,
                 reparameterize: bool = True, train_modules: Optional[Sequence[str]] = None):
        if prefix_length < 1 or hidden < 1:
            raise ValueError(f"prefix_length and hidden must be >= 1, got {prefix_length} "
                             f"and {hidden}")
        self.prefix_length, self.hidden = prefix_length, hidden
        self.reparameterize = reparameterize
        self.slots: Dict[Path, Tuple[int, ...]] = {}
        super().__init__(base_model, train_modules)

    def adapt_config(self, config):
        return config.replace(prefix_length=self.prefix_length)

    def strip_base(self, base):
        flat = traverse_util.flatten_dict(base)
        self.slots = {p: tuple(nn.unbox(v).shape) for p, v in flat.items()
                      if p[-1] in PREFIX_SLOTS}
        if not self.reparameterize:
            return base
        return traverse_util.unflatten_dict({p: v for p, v in flat.items()
                                             if p not in self.slots})

    def init_extra(self, rng, base):
        if not self.reparameterize:
            return {}
        width = self.config.d_model          # out: every slot's numbers for one position
        out = sum(math.prod(s) for s in self.slots.values()) // self.prefix_length
        r = jax.random.split(rng, 3)
        normal = lambda key, shape, std: std * jax.random.normal(key, shape, jnp.float32)  # noqa: E731
        return {"prefix_mlp": {
            "embedding": normal(r[0], (self.prefix_length, width), 1.0),      # P' [p, d]
            "hidden": {"kernel": normal(r[1], (width, self.hidden), width ** -0.5),
                       "bias": jnp.zeros((self.hidden,), jnp.float32)},
            "out": {"kernel": normal(r[2], (self.hidden, out), self.hidden ** -0.5),
                    "bias": jnp.zeros((out,), jnp.float32)}}}

    def prefixes(self, mlp: Params) -> Dict[Path, jax.Array]:
        """P = MLP(P'): every slot's [*layers, p, heads, head_dim] tensor."""
        h = jnp.tanh(mlp["embedding"] @ mlp["hidden"]["kernel"] + mlp["hidden"]["bias"])
        flat = h @ mlp["out"]["kernel"] + mlp["out"]["bias"]            # [p, Σ L·h·d]
        out, offset = {}, 0
        for path, shape in sorted(self.slots.items()):
            lead, per = shape[:-3], math.prod(shape[-2:])               # [*L] and h·d
            size = math.prod(lead) * per
            chunk = flat[:, offset:offset + size].reshape((self.prefix_length,) + lead
                                                          + shape[-2:])
            out[path] = jnp.moveaxis(chunk, 0, len(lead))               # [*L, p, h, d]
            offset += size
        return out

    def to_base(self, params):
        base = super().to_base(params)
        if not self.reparameterize:
            return base
        flat = traverse_util.flatten_dict(base)
        flat.update(self.prefixes(params["prefix_mlp"]))
        return traverse_util.unflatten_dict(flat)

    def drop_reparameterization(self, params: Params) -> Params:
        """A trained tree with the MLP replaced by the prefixes it computes."""
        return self.to_base(params) if self.reparameterize else params

    def method_trainable(self, path):
        return path[0] == "prefix_mlp" or path[-1] in PREFIX_SLOTS


class AdapterTuning(Lightweight):
    """Houlsby adapters of `adapter_size` units (2·(2md + d + m) per layer) and, with
    `train_norms` (the paper), every layer norm's scale and bias."""

    def __init__(self, base_model: Model, adapter_size: int = 64, train_norms: bool = True,
                 train_modules: Optional[Sequence[str]] = None):
        if adapter_size < 1:
            raise ValueError(f"adapter_size must be >= 1, got {adapter_size}")
        self.adapter_size, self.train_norms = adapter_size, train_norms
        super().__init__(base_model, train_modules)

    def adapt_config(self, config):
        return config.replace(adapter_size=self.adapter_size)

    def method_trainable(self, path):
        return any(p in ("attention_adapter", "mlp_adapter") for p in path) or (
            self.train_norms and any(p.endswith("norm") for p in path[:-1]))


METHODS: Dict[str, Callable[..., Lightweight]] = {
    "lora": LoraTuning, "prompt": PromptTuning, "prefix": PrefixTuning,
    "adapter": AdapterTuning}


def wrap(model: Model, method: Optional[str] = None,
         methods: Optional[Mapping[str, Callable[..., Lightweight]]] = None) -> Model:
    """`model` fine-tuned in full (method None) or through one lightweight `method`
    ('lora' | 'prompt' | 'prefix' | 'adapter'); `methods` overrides `METHODS` (the run layer
    passes versions whose options gin binds on the class, t2t/run/configurables.py)."""
    if method is None:
        return model
    methods = {**METHODS, **(methods or {})}
    if method not in methods:
        raise ValueError(f"wrap.method={method!r}; choose one of {sorted(methods)} or None")
    return methods[method](model)
