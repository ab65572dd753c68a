"""Every library class and function a gin file binds, registered in this one module.

The library (`t2t.nn`, `models`, `data`, `train`) does not import gin: its classes take
their arguments explicitly. Here each is registered under its own name with
`gin.external_configurable`, which returns a version that applies the gin bindings and
then builds the plain library object (`TransformerConfig()` here is a
`t2t.nn.config.TransformerConfig` with the bound fields). The run layer's builders
(`t2t.run.experiment`, `finetune`, `aot`) construct through these names and hand the
objects to the library.
"""
from __future__ import annotations

from typing import Callable, Dict

import gin

from t2t.data import bundle
from t2t.data.catalog import paper
from t2t.models import base, distill, electra, elmo, families, lightweight, spanbert
from t2t.nn import config as nn_config
from t2t.train import optimizers, partitioning, trainer

# Every configurable of t2t by name -> the undecorated callable ("did you mean" hints).
REGISTERED: Dict[str, Callable] = {}


def _register(fn_or_cls, name: str | None = None):
    REGISTERED[name or fn_or_cls.__name__] = fn_or_cls
    return gin.external_configurable(fn_or_cls, name=name)


def configurable(fn: Callable) -> Callable:
    """`gin.configurable` for the run layer's own builders (`experiment`, ...), recorded."""
    REGISTERED[fn.__name__] = fn
    return gin.configurable(fn)


TransformerConfig = _register(nn_config.TransformerConfig)
TrainConfig = _register(trainer.TrainConfig)
MeshConfig = _register(partitioning.MeshConfig)
LossConfig = _register(base.LossConfig)
ElmoConfig = _register(elmo.ElmoConfig)
make_schedule = _register(optimizers.make_schedule)
make_optimizer = _register(optimizers.make_optimizer)

# Pretraining models whose options gin binds on the class (ElectraPretrainingModel.rtd_weight,
# DistillationModel.temperature, ...): `families.make_model(..., classes=MODEL_CLASSES)`.
MODEL_CLASSES: Dict[str, type] = {
    "electra": _register(electra.ElectraPretrainingModel),
    "spanbert": _register(spanbert.SpanBertPretrainingModel),
    "distill": _register(distill.DistillationModel),
}
# Lightweight fine-tuning: `wrap.method` picks one, its options are bound on its class.
LIGHTWEIGHT_METHODS: Dict[str, type] = {
    name: _register(cls) for name, cls in lightweight.METHODS.items()}
wrap_model = _register(lightweight.wrap, name="wrap")

# The paper-scale tasks' vocabularies, called when a task is first used: the versions
# registered here read `t5_vocabulary.path` / `bert_vocabulary.path` from gin.
paper.VOCABULARY_PROVIDERS.update(
    t5=_register(paper.t5_vocabulary), bert=_register(paper.bert_vocabulary))
# The micro scale's data from a bundle (`t2t data bundle`), for a machine that has not built
# it: `CORPUS = @bundle_corpus()` and `experiment.task = @bundle_task()` (scales/t5_gpu_micro.gin).
bundle_corpus = _register(bundle.bundle_corpus)
bundle_task = _register(bundle.bundle_task)


# The config classes gin binds, by the library class a family names (`Family.config`).
CONFIGS: Dict[type, Callable] = {nn_config.TransformerConfig: TransformerConfig,
                                 elmo.ElmoConfig: ElmoConfig}


def model_config(family: str):
    """The gin-bound config of a model family (`TransformerConfig`, ELMo's `ElmoConfig`;
    a config class gin does not know is built with its defaults)."""
    config = families.get(family).config
    return CONFIGS.get(config, config)()


def generator_config(family: str, config):
    """The generator's config of a family that pretrains one beside it (ELECTRA's, sized by
    the bound `generator_size`); None for the others."""
    fam = families.get(family)
    if not fam.generator:
        return None
    return MODEL_CLASSES.get(family, fam.model)(config).generator_config


def make_mesh(devices=None):
    """The mesh `MeshConfig` bindings describe (over `devices`, default all)."""
    return partitioning.make_mesh(MeshConfig(), devices=devices)


def wrap(model):
    """`model` as `wrap.method` fine-tunes it (None: in full), with the bound options."""
    return wrap_model(model, methods=LIGHTWEIGHT_METHODS)
