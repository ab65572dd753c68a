"""The registry of model families: one `Family` per family owns what the rest of t2t asks
about it (its flax module and `Model` wrapper, config class, example inputs, feature
converter, FLOP formula, decoding, fine-tuning heads, Hugging Face model types and
tokenizer kind); everything else looks the family up by name (`get`).

The built-in families register in `t2t.models.catalog`, imported on the first lookup; a
family of your own is one module that defines its module and wrapper and calls `register`
(tests/models/test_family_registry.py trains one through `t2t train`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Tuple

import flax.linen as nn
import jax
import numpy as np

from t2t.errors import ConfigError
from t2t.models.heads import BERT_POOLER, PoolerStyle
from t2t.nn.config import TransformerConfig

if TYPE_CHECKING:
    from t2t.models.base import LossConfig, Model
    from t2t.models.decoding import Decoding


@dataclasses.dataclass(frozen=True)
class FlopFormula:
    """What `t2t.train.flops` counts for a family: the Transformer count over the stacks it
    runs, or a count of its own (`forward(config, input_length=, target_length=,
    num_masked=, causal=) -> {"dense", "attention", "logits"}`, lengths checked first)."""

    encoder: bool = False          # an encoder over `input_length` tokens
    decoder: bool = False          # a decoder over `target_length` tokens
    # vocabulary logits only at the masked positions: none for a batch without
    # `masked_positions` (a fine-tuning head)
    masked_logits: bool = False
    forward: Optional[Callable[..., Dict[str, float]]] = None


ENCODER = FlopFormula(encoder=True, masked_logits=True)
DECODER = FlopFormula(decoder=True)
ENCODER_DECODER = FlopFormula(encoder=True, decoder=True)


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family. `name` is its MODEL_FAMILY and its wrapper's `Model.family`."""

    name: str
    title: str                                   # as its paper writes it: "GPT-2"
    module: Callable[[Any], nn.Module]           # config -> the module holding its parameters
    model: Callable[..., "Model"]                # the wrapper `t2t train` builds (see make_model)
    # (batch, length, target_length, max_predictions) -> keyword inputs of `module`
    inputs: Callable[..., Dict[str, jax.Array]]
    converter: type                              # default feature converter (t2t.data)
    flops: FlopFormula
    config: type = TransformerConfig
    # the converter for inputs -> targets objectives, where it differs (GPT's prefix LM)
    prefix_converter: Optional[type] = None
    decoding: Optional["Decoding"] = None        # how `predict` decodes; None: it does not
    # fine-tuning heads by task kind ("classification", "multiple_choice", ...)
    heads: Mapping[str, type] = dataclasses.field(default_factory=dict)
    # how its pooled heads read the first token, by task kind (`head` binds it; BERT's
    # pooler where none is given): its Hugging Face task heads' layout
    head_styles: Mapping[str, PoolerStyle] = dataclasses.field(default_factory=dict)
    teacher: bool = False         # the wrapper is a student: model(teacher=(config, params))
    generator: bool = False       # pretraining trains a generator beside it (`generator_config`)
    masked_lm: bool = False       # its pretraining tree predicts masked tokens (`t2t mlm_eval`)
    tokenizer: str = "sentencepiece"             # its paper's vocabulary kind
    hf_model_types: Tuple[str, ...] = ()   # config.json model_types (t2t.convert.pretrained.FORMS)
    # another family whose module, wrapper and FLOP count it shares (RoBERTa: BERT's); it
    # differs in its vocabulary and Hugging Face form
    variant_of: Optional[str] = None

    def default_converter(self, objective: Optional[str] = None) -> type:
        """`converter`, or `prefix_converter` for an inputs -> targets objective."""
        if self.prefix_converter is not None and objective not in (None, "lm", "causal_lm"):
            return self.prefix_converter
        return self.converter

    def variant(self, **changes) -> "Family":
        """This family's module, wrapper and FLOP count under another name (`changes`)."""
        return dataclasses.replace(self, variant_of=self.name, **changes)


_REGISTRY: Dict[str, Family] = {}


def register(family: Family, overwrite: bool = False) -> Family:
    """Add `family` (a name already taken is an error unless `overwrite`)."""
    _load_catalog()        # the built-in families first, whoever registers
    if family.name in _REGISTRY and not overwrite:
        raise ValueError(f"model family {family.name!r} is already registered")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_catalog() -> None:
    from t2t.models import catalog  # noqa: F401  registers the built-in families


def registered(variants: bool = True) -> List[Family]:
    """Every family, in registration order (`variants=False`: not the variants)."""
    _load_catalog()
    return [f for f in _REGISTRY.values() if variants or f.variant_of is None]


def names(where: Callable[[Family], Any] = lambda f: True, variants: bool = True
          ) -> List[str]:
    """The names of the families `where` holds for."""
    return [f.name for f in registered(variants) if where(f)]


def get(name: str) -> Family:
    _load_catalog()
    if name not in _REGISTRY:
        raise ValueError(f"unknown model family {name!r}; choose one of {names()}")
    return _REGISTRY[name]


def head(family: str, kind: str) -> Callable[..., "Model"]:
    """The family's fine-tuning head for a task `kind` (`Family.heads`), its pooler style
    bound when the family gives one (`Family.head_styles`)."""
    fam = get(family)
    if kind not in fam.heads:
        having = names(lambda f: kind in f.heads, variants=False)
        raise ConfigError(f"the {family!r} family has no {kind} head; families with one: "
                          f"{', '.join(having)}")
    if kind in fam.head_styles:
        return functools.partial(fam.heads[kind], style=fam.head_styles[kind])
    return fam.heads[kind]


def head_style(family: str, kind: str) -> PoolerStyle:
    """How the family's pooled head for a task `kind` reads the first token
    (`Family.head_styles`; BERT's pooler by default)."""
    return get(family).head_styles.get(kind, BERT_POOLER)


def make_module(family: str, config) -> nn.Module:
    """The family's flax module (BERT: `BertModel`, encoder and heads; T5: `EncoderDecoder`;
    ELECTRA: the discriminator, the model fine-tuned and the one its papers count)."""
    return get(family).module(config)


def make_model(family: str, config, loss: Optional["LossConfig"] = None, teacher=None,
               classes: Optional[Mapping[str, Callable[..., "Model"]]] = None) -> "Model":
    """The family's wrapper (init / loss_fn / score) around its module. A student family
    (DistilBERT) takes `teacher` = (config, params), whose size its own follows. `classes`
    replaces wrappers by family name (the run layer passes gin-configurable versions,
    t2t/run/configurables.py)."""
    fam = get(family)
    cls = (classes or {}).get(family, fam.model)
    if fam.teacher:
        if teacher is None:
            raise ValueError(f"the {family!r} family needs a teacher: bind TEACHER (see "
                             "configs/experiments/distilbert_tiny_bible.gin)")
        first = teacher
    else:
        first = config
    return cls(first) if loss is None else cls(first, loss)


def example_inputs(family: str, batch: int = 2, length: int = 16, target_length: int = 8,
                   max_predictions: int = 4) -> Dict[str, jax.Array]:
    """Keyword inputs of the right shapes for `make_module(family, ...)`."""
    return get(family).inputs(batch=batch, length=length, target_length=target_length,
                              max_predictions=max_predictions)


def abstract_params(family: str, config):
    """Parameter shapes (logical boxes removed) without allocating them."""
    module = make_module(family, config)
    inputs = example_inputs(family)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), **inputs))
    return nn.unbox(shapes["params"])


def count_params(family: str, config) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(
        abstract_params(family, config))))
