"""A model directory, t2t's or Hugging Face's, read into config, parameters and vocabulary.

* `load_model_dir(path, step=None)`: a Hugging Face directory (config.json +
  model.safetensors, through `t2t.convert.pretrained.load_pretrained`, with its tokenizer)
  or a t2t MODEL_DIR (its operative config, MODEL_DIR/config.gin, parsed into gin, and the
  parameters of its latest checkpoint or of `step`) as one `LoadedModel`; used by
  `t2t convert` and `t2t mlm_eval`.
* `pretrained_params(path)`: the parameters alone, of a Hugging Face directory or of any
  t2t checkpoint (a MODEL_DIR, its `checkpoints/`, or one step), for a fine-tuning's
  `init_from_pretrained`.
* `is_hf_dir` / `hf_family`: which kind of directory a path is.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

from t2t import storage
from t2t.errors import UserError
from t2t.train.checkpoints import restore_params

Params = Any


def is_hf_dir(path: str) -> bool:
    """A Hugging Face model directory (config.json, no t2t checkpoints)."""
    root = storage.path(path)
    return (root / "config.json").is_file() and not (root / "checkpoints").is_dir()


def hf_family(path: Optional[str]) -> Optional[str]:
    """The t2t family of the Hugging Face directory `path` (None: not one)."""
    if path is None or not is_hf_dir(path):
        return None
    from t2t.convert import pretrained
    return pretrained.family_of(pretrained.read_config(path)[0])


def pretrained_params(path: str) -> Params:
    """Pretrained parameters as numpy: a Hugging Face directory's (a task head's tree is
    t2t's fine-tuning head's, `t2t.convert.hf_heads`) or a t2t checkpoint's
    (`t2t.train.checkpoints.restore_params`: the latest step, or the step `path` names)."""
    if is_hf_dir(path):
        from t2t.convert import pretrained
        return pretrained.load_pretrained(path).params
    return restore_params(path)


@dataclasses.dataclass
class LoadedModel:
    """A model directory as t2t reads it.

    `family`: the t2t model family (a t2t MODEL_DIR's MODEL_FAMILY; None when its config
    binds none). `config`: its TransformerConfig (a t2t run's: the bound TransformerConfig
    with the vocabulary size of its token table). `params`: numpy arrays. `pretrained`: the
    `PretrainedModel` of a Hugging Face directory (None for a t2t MODEL_DIR). `step`: the
    checkpoint step read (None for a Hugging Face directory)."""

    path: str
    family: Optional[str]
    config: Any
    params: Params
    pretrained: Any = None
    step: Optional[int] = None

    @property
    def is_hf(self) -> bool:
        """Whether it was read from a Hugging Face directory."""
        return self.pretrained is not None

    @property
    def vocabulary(self):
        """A Hugging Face directory's tokenizer (`PretrainedModel.vocabulary`, read when
        first asked for; None without tokenizer files); None for a t2t MODEL_DIR, whose
        vocabulary is its task's."""
        return self.pretrained.vocabulary if self.is_hf else None


def is_t2t_model_dir(path: str) -> bool:
    """A (local) t2t MODEL_DIR: it has its operative config, config.gin."""
    return os.path.isfile(os.path.join(path, "config.gin"))


def load_model_dir(path: str, step: Optional[int] = None) -> LoadedModel:
    """`path` (a Hugging Face directory or a t2t MODEL_DIR) as a `LoadedModel`; for a t2t
    MODEL_DIR its config.gin becomes the gin config (the bound TransformerConfig is its
    architecture) and `step` picks the checkpoint (None: the latest). Not a directory, or
    neither kind, is one line (UserError); a MODEL_DIR without checkpoints too."""
    if not storage.path(path).is_dir():
        raise UserError(f"{path!r} does not exist or is not a directory (expected a Hugging "
                        "Face model directory or a t2t MODEL_DIR)")
    if is_hf_dir(path):
        from t2t.convert import pretrained
        model = pretrained.load_pretrained(path)
        return LoadedModel(path, pretrained.family_of(model.model_type), model.config,
                           model.params, model)
    if not is_t2t_model_dir(path):
        raise UserError(f"{path!r} has neither config.json (Hugging Face) nor config.gin "
                        "(a t2t MODEL_DIR)")
    import gin

    from t2t.run import configurables as configured
    from t2t.run import gin_utils
    from t2t.train.checkpoints import checkpoint_dir, latest_step
    step = latest_step(checkpoint_dir(path)) if step is None else step
    if step is None:
        raise UserError(f"MODEL_DIR {path!r} has no checkpoints; run `t2t train` (or "
                        "`t2t finetune`) first")
    params = restore_params(path, step=step)
    gin_utils.parse([os.path.join(path, "config.gin")], [])
    family = gin_utils.query_macro("MODEL_FAMILY")
    if not isinstance(family, str):
        try:
            family = gin.query_parameter("experiment.family")
        except ValueError:
            family = None
    config = configured.TransformerConfig()
    embedding = params.get("token_embedder", {}).get("embedding")
    if embedding is not None:
        config = config.replace(vocab_size=embedding.shape[0])
    return LoadedModel(path, family if isinstance(family, str) else None, config, params,
                       step=step)
