"""The conversion engine every Hugging Face family's converter uses: a table of `Rule`s,
each one HF tensor name <-> one or more t2t parameter paths, drives both directions
(`import_params`: a state dict -> a t2t tree; `export_params`: a tree -> a state dict).

Trees are plain nested dicts of numpy arrays. Layers go under `layers/layer_{i}`, or
stacked under `layers/layer` with a leading layer axis when the config scans its layers
(`stack_layers`); a table is always written per layer.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from flax import traverse_util
from flax.core.meta import unbox

from t2t.nn.config import TransformerConfig

log = logging.getLogger(__name__)

Params = Dict[str, object]          # nested dict of np.ndarray
StateDict = Mapping[str, np.ndarray]
Path = Tuple[str, ...]


class CheckpointMismatchError(ValueError):
    """A checkpoint tensor is missing or does not have the shape the config implies."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One HF tensor <-> one or more t2t params.

    to_t2t(hf_array) -> tuple of arrays for `paths`; to_hf(tuple of arrays) -> hf_array.
    `aliases` are other HF names to read the tensor from (tied copies, legacy names).
    """

    hf: str
    hf_shape: Tuple[int, ...]
    paths: Tuple[Path, ...]
    shapes: Tuple[Tuple[int, ...], ...]
    to_t2t: Callable
    to_hf: Callable
    aliases: Tuple[str, ...] = ()


def split(path: str) -> Path:
    """"a/b/c" -> ("a", "b", "c")."""
    return tuple(path.split("/"))


def copy(hf: str, path: str, shape, aliases=()) -> Rule:
    """The same array on both sides."""
    shape = tuple(shape)
    return Rule(hf, shape, (split(path),), (shape,), lambda w: (w,), lambda ws: ws[0],
                tuple(aliases))


def linear(hf: str, path: str, shape, n_in: int = 1) -> Rule:
    """nn.Linear weight [out, in] <-> t2t kernel [*in_dims, *out_dims] (first n_in are in)."""
    shape = tuple(shape)
    fan_in, fan_out = int(np.prod(shape[:n_in])), int(np.prod(shape[n_in:]))
    return Rule(hf, (fan_out, fan_in), (split(path),), (shape,),
                lambda w: (w.T.reshape(shape),),
                lambda ws: ws[0].reshape(fan_in, fan_out).T)


def reshape(hf: str, path: str, hf_shape, shape) -> Rule:
    """Same data in another shape (biases [h*d] <-> [h, d]; Conv1D [in, out] kernels)."""
    hf_shape, shape = tuple(hf_shape), tuple(shape)
    return Rule(hf, hf_shape, (split(path),), (shape,), lambda w: (w.reshape(shape),),
                lambda ws: ws[0].reshape(hf_shape))


def transpose(hf: str, path: str, shape, aliases=()) -> Rule:
    """A 2-D array transposed (t2t `shape` <-> HF `shape[::-1]`)."""
    shape = tuple(shape)
    return Rule(hf, shape[::-1], (split(path),), (shape,), lambda w: (w.T,),
                lambda ws: ws[0].T, tuple(aliases))


def dense(hf: str, path: str, n_in: int, n_out: int, bias: bool = True) -> List[Rule]:
    """An nn.Linear `hf` (weight [out, in], bias [out]) <-> a t2t Dense `path` (kernel
    [in, out], bias [out])."""
    rules = [linear(f"{hf}.weight", f"{path}/kernel", (n_in, n_out))]
    if bias:
        rules.append(copy(f"{hf}.bias", f"{path}/bias", (n_out,)))
    return rules


def nest(prefix: str, rules: Sequence[Rule]) -> List[Rule]:
    """`rules` with every t2t path under `prefix` ("decoder": a Decoder inside a head)."""
    return [dataclasses.replace(r, paths=tuple(split(prefix) + p for p in r.paths))
            for r in rules]


def layer_norm(hf: str, path: str, d: int, bias: bool = True) -> List[Rule]:
    """A LayerNorm's weight (legacy `gamma`) and bias (`beta`) <-> `scale` and `bias`."""
    rules = [copy(f"{hf}.weight", f"{path}/scale", (d,), aliases=(f"{hf}.gamma",))]
    if bias:
        rules.append(copy(f"{hf}.bias", f"{path}/bias", (d,), aliases=(f"{hf}.beta",)))
    return rules


# ----------------------------------------------------------------------- both directions
_LAYER = re.compile(r"layer_(\d+)$")


def _fetch(state: StateDict, rule: Rule) -> np.ndarray:
    for name in (rule.hf,) + rule.aliases:
        if name in state:
            w = np.asarray(state[name])
            if tuple(w.shape) != rule.hf_shape:
                raise CheckpointMismatchError(
                    f"checkpoint tensor {name!r} has shape {tuple(w.shape)}, but the config "
                    f"implies {rule.hf_shape} (for t2t {_names(rule)})")
            return w
    raise CheckpointMismatchError(
        f"checkpoint has no tensor {rule.hf!r} (expected shape {rule.hf_shape}, for t2t "
        f"{_names(rule)})")


def _names(rule: Rule) -> str:
    return ", ".join("/".join(p) for p in rule.paths)


def import_params(state: StateDict, rules: Sequence[Rule], config: TransformerConfig,
                  scan: Optional[bool]) -> Params:
    """A state dict -> the t2t tree `rules` describe (in `config.params_dtype`); tensors no
    rule reads are named in one warning. `scan` (default `config.scan_layers`) stacks the
    layers for `nn.scan`."""
    flat: Dict[Path, np.ndarray] = {}
    for rule in rules:
        for path, arr in zip(rule.paths, rule.to_t2t(_fetch(state, rule))):
            flat[path] = np.ascontiguousarray(arr, dtype=config.params_dtype)
    used = {n for r in rules for n in (r.hf,) + r.aliases}
    unused = sorted(n for n in state if n not in used and not _is_buffer(n))
    if unused:
        log.warning("ignored %d checkpoint tensors: %s", len(unused), unused[:10])
    if config.scan_layers if scan is None else scan:
        flat = stack_layers(flat)
    return traverse_util.unflatten_dict(flat)


def _is_buffer(name: str) -> bool:
    return name.endswith(("position_ids", ".attn.bias", ".attn.masked_bias"))


def _layer_axis(path: Path) -> Optional[int]:
    """Index of the `layer_{i}` / `layer` key right under a `layers` stack, if any."""
    if "layers" in path[:-1]:
        return path.index("layers") + 1
    return None


def stack_layers(flat: Dict[Path, np.ndarray]) -> Dict[Path, np.ndarray]:
    """`layers/layer_{i}/...` -> `layers/layer/...` with a leading layer axis (nn.scan)."""
    out, groups = {}, {}
    for path, arr in flat.items():
        j = _layer_axis(path)
        if j is None:
            out[path] = arr
        else:
            stacked = path[:j] + ("layer",) + path[j + 1:]
            groups.setdefault(stacked, {})[int(_LAYER.match(path[j]).group(1))] = arr
    for path, by_index in groups.items():
        out[path] = np.stack([by_index[i] for i in range(len(by_index))])
    return out


def unstack_layers(flat: Dict[Path, np.ndarray]) -> Dict[Path, np.ndarray]:
    """Inverse of `stack_layers` (a no-op on unstacked trees)."""
    out = {}
    for path, arr in flat.items():
        j = _layer_axis(path)
        if j is None or path[j] != "layer":
            out[path] = arr
            continue
        for i in range(arr.shape[0]):
            out[path[:j] + (f"layer_{i}",) + path[j + 1:]] = arr[i]
    return out


def export_params(params: Params, rules: Sequence[Rule]) -> Dict[str, np.ndarray]:
    """A t2t tree -> the state dict `rules` describe (float32); a parameter no rule writes
    is an error."""
    flat = unstack_layers(flat_params(params))
    out = {}
    for rule in rules:
        arrays = []
        for path, shape in zip(rule.paths, rule.shapes):
            if path not in flat:
                raise CheckpointMismatchError(f"params have no {'/'.join(path)!r} "
                                              f"(expected shape {shape}, for HF {rule.hf!r})")
            arr = flat.pop(path)
            if tuple(arr.shape) != shape:
                raise CheckpointMismatchError(
                    f"param {'/'.join(path)!r} has shape {tuple(arr.shape)}, but the config "
                    f"implies {shape} (for HF {rule.hf!r})")
            arrays.append(arr.astype(np.float32))
        out[rule.hf] = np.ascontiguousarray(rule.to_hf(tuple(arrays)))
    if flat:
        raise CheckpointMismatchError("params with no Hugging Face counterpart: "
                                      + ", ".join("/".join(p) for p in sorted(flat)))
    return out


def initialise(rules: Sequence[Rule], config: TransformerConfig, what: str,
               seed: int = 0) -> Params:
    """The t2t params `rules` describe, newly initialised (kernels and tables normal with
    `config.initializer_range`, norm scales 1, biases 0; seeded, so a reload is identical),
    for a head a checkpoint lacks; named in one log line (`what`: the head)."""
    rng = np.random.RandomState(seed)
    flat: Dict[Path, np.ndarray] = {}
    for rule in rules:
        for path, shape in zip(rule.paths, rule.shapes):
            if path[-1] == "scale":
                arr = np.ones(shape)
            elif path[-1] in ("kernel", "embedding"):
                arr = rng.normal(0.0, config.initializer_range, shape)
            else:
                arr = np.zeros(shape)
            flat[path] = arr.astype(config.params_dtype)
    log.warning("checkpoint has no %s: initialised %s", what,
                ", ".join(sorted({"/".join(p[:-1]) for p in flat})))
    return traverse_util.unflatten_dict(flat)


def merge(*trees) -> Params:
    """Nested dicts joined (later trees win on a shared path)."""
    flat: Dict[Path, np.ndarray] = {}
    for t in trees:
        flat.update(flat_params(t))
    return traverse_util.unflatten_dict(flat)


def tree(params) -> Params:
    """`params` as a plain nested dict of numpy arrays (see `flat_params`)."""
    return traverse_util.unflatten_dict(flat_params(params))


def flat_params(params) -> Dict[Path, np.ndarray]:
    """{path: numpy array}; accepts {"params": tree}, boxed (partitioned) leaves, jax arrays."""
    if isinstance(params, Mapping) and set(params) == {"params"}:
        params = params["params"]
    flat = traverse_util.flatten_dict(unbox(params))
    return {path: np.asarray(arr) for path, arr in flat.items()}
