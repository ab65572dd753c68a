"""Ahead-of-time compilation of a gin-configured step for a TPU slice this host lacks.

`t2t compile` builds exactly what `t2t train` (or `t2t finetune`, or decoding) would run —
the same model, rules, mesh, optimizer, dtype, scan/remat and global batch — but abstract
(`Trainer.abstract_init`, ShapeDtypeStructs with shardings: nothing is allocated), over the
compile-only devices libtpu makes for the slice (`t2t.train.chips`), then lowers and
compiles it with XLA's TPU compiler and reads the executable's own memory and cost
analyses: does the step fit in HBM, and how fast could it be.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import math
import os
import re
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.compilation_cache import compilation_cache

from t2t.errors import UserError
from t2t.models import families
from t2t.train import chips as chips_lib
from t2t.train.chips import TopologyError
from t2t.train import flops as flops_lib
from t2t.train import partitioning
from t2t.train.trainer import Trainer, TrainState, batch_geometry

STEPS = ("train", "finetune", "decode")
# Macros a run requires and a compile never reads (it writes and restores nothing).
UNREAD_MACROS = {"MODEL_DIR": "'/nonexistent/t2t-compile-writes-nothing'",
                 "INITIAL_CHECKPOINT": "None"}


def parse_gin(gin_files: Sequence[str], bindings: Sequence[str], check: bool = True) -> None:
    """`t2t train`'s gin parsing and checks, except that MODEL_DIR and INITIAL_CHECKPOINT
    may stay unset (a compile reads and writes neither). `check=False`: bindings need not
    all be used (an ablation stage's, which bind every stage's macros)."""
    from t2t.run import gin_utils
    gin_utils.parse(gin_files, bindings)
    defined, _ = gin_utils.macros(gin.config_str())
    unset = [f"{name} = {value}" for name, value in UNREAD_MACROS.items()
             if defined.get(name) == "%gin.REQUIRED"]
    gin_utils.parse((), unset, clear=False)
    if check:
        gin_utils.check_bindings(bindings)
GiB = chips_lib.GiB


@dataclasses.dataclass
class Buffer:
    """One large per-chip buffer of the compiled step and the knob that shrinks it."""

    what: str
    bytes: int
    knob: str


@dataclasses.dataclass
class Report:
    """Per-chip memory and FLOPs of one compiled step on one slice."""

    step: str
    slice: chips_lib.Slice
    num_slices: int
    mesh: Dict[str, int]
    family: str
    num_params: int
    batch_shapes: Dict[str, Tuple[int, ...]]
    state_bytes: Dict[str, int]       # parameters / optimizer state / batch, per chip
    memory: Dict[str, int]            # XLA: arguments, outputs, aliased, temporaries, code
    xla_flops: float                  # per chip: hlo_flops / chips (0: not counted)
    model_flops: float                # whole step, t2t.train.flops (0: not counted)
    largest: List[Buffer]
    train_steps: int = 0              # TrainConfig.train_steps of the configured run
    note: str = ""                    # how the numbers were had when XLA gave up
    compiled: Any = dataclasses.field(default=None, repr=False)   # the TPU executable

    @property
    def num_chips(self) -> int:
        return self.slice.num_chips * self.num_slices

    @property
    def total_bytes(self) -> int:
        m = self.memory
        return (m["arguments"] + m["outputs"] - m["aliased"] + m["temporaries"]
                + m["generated_code"])

    @property
    def hbm_bytes(self) -> int:
        return self.slice.chip.hbm_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    @property
    def step_time(self) -> float:
        """Seconds per step if every chip ran XLA's FLOPs at the bf16 peak."""
        return self.xla_flops / self.slice.chip.peak_bf16

    @property
    def mfu_ceiling(self) -> Optional[float]:
        """Model FLOPs over the FLOPs XLA executes: MFU if the step were compute-bound."""
        if not self.model_flops or not self.xla_flops:
            return None
        return self.model_flops / self.num_chips / self.xla_flops

    def to_dict(self) -> Dict[str, Any]:
        """The numbers of `lines()`, for scripts (benchmarks/compile_table.py)."""
        return {"step": self.step, "topology": self.slice.name, "libtpu_topology":
                self.slice.topology, "num_slices": self.num_slices, "chips": self.num_chips,
                "device_kind": self.slice.chip.device_kind, "mesh": self.mesh,
                "family": self.family, "num_params": self.num_params,
                "batch_shapes": {k: list(v) for k, v in self.batch_shapes.items()},
                "bytes_per_chip": {**self.state_bytes, **self.memory,
                                   "total": self.total_bytes},
                "hbm_bytes": self.hbm_bytes, "fits": self.fits,
                "xla_flops_per_chip": self.xla_flops,
                "model_flops_per_chip": self.model_flops / self.num_chips,
                "step_time_s": self.step_time if self.xla_flops else None,
                "mfu_ceiling": self.mfu_ceiling,
                "largest": [dataclasses.asdict(b) for b in self.largest],
                "train_steps": self.train_steps, "verdict": self.verdict()}

    def verdict(self) -> str:
        where = self.slice.name + (f" x {self.num_slices} slices" if self.num_slices > 1 else "")
        word = "fits" if self.fits else "does not fit"
        return (f"{word}: {self.total_bytes / GiB:.2f} GiB of {self.hbm_bytes / GiB:.2f} GiB "
                f"HBM per chip on {where}")

    def lines(self) -> List[str]:
        chip, m, s = self.slice.chip, self.memory, self.state_bytes
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        batch = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.batch_shapes.items())
        out = [f"{self.step} step of {self.family} ({self.num_params:,d} parameters) on "
               f"{self.slice.name} = {self.slice.topology}"
               + (f" x {self.num_slices} slices" if self.num_slices > 1 else "")
               + f": {self.num_chips} chips ({chip.device_kind}), mesh {mesh}",
               f"global batch: {batch}", "",
               f"{'per chip':<54}{'GiB':>9}"]
        rows = [("parameters", s["parameters"]), ("optimizer state", s["optimizer_state"]),
                ("batch", s["batch"]),
                ("arguments (XLA: the three above, tiled and padded)", m["arguments"]),
                ("outputs not aliased to arguments", m["outputs"] - m["aliased"]),
                ("temporaries", m["temporaries"]), ("generated code", m["generated_code"])]
        rows += [("total (arguments + outputs + temporaries + code)", self.total_bytes),
                 (f"HBM ({chip.name} datasheet)", self.hbm_bytes)]
        out += [f"  {name:<52}{value / GiB:>9.3f}" for name, value in rows] + [""]
        uncounted = ("not counted (decoding loops one token at a time; XLA counts a loop body "
                     "once)" if self.step == "decode" else
                     "not counted (a scanned model of no pretraining family)")
        xla = (f"XLA {self.xla_flops:.4g} (HLO cost analysis, remat included)"
               if self.xla_flops else f"XLA: {uncounted}")
        out.append(f"FLOPs per step and chip: {xla}"
                   + (f"; model {self.model_flops / self.num_chips:.4g} (t2t.train.flops)"
                      if self.model_flops else ""))
        ceiling = self.mfu_ceiling
        if self.xla_flops:
            out.append(f"compute-bound step time {self.step_time * 1e3:.4g} ms at "
                       f"{chip.peak_bf16 / 1e12:.0f} TFLOP/s bf16 per chip"
                       + (f"; MFU ceiling {ceiling:.1%}" if ceiling is not None else ""))
        if self.note:
            out.append(self.note)
        if not self.fits:
            out.append("largest buffers per chip:")
            out += [f"  {b.bytes / GiB:8.3f} GiB  {b.what}  -> {b.knob}" for b in self.largest]
        out.append(self.verdict())
        return out


# ----------------------------------------------------------------------------- building


def build(step: str):
    """(trainer, global example batch as numpy zeros) of the gin-configured experiment;
    call inside `partitioning.target_devices`. Reads no training data where the
    experiment has a feature converter (the batch is the converter's empty rows)."""
    from t2t.run import experiment as experiment_lib
    from t2t.run import finetune
    exp = finetune.finetune_experiment() if step == "finetune" else experiment_lib.experiment()
    if exp.converter is not None:
        batch = exp.converter([], num_rows=exp.batch_size)
    else:   # classifier experiments: features come from the tokenized split
        batch = next(exp.data(process_index=0, process_count=1))
    return exp, batch


def _bytes_per_chip(tree: Any) -> int:
    """Bytes one device holds of a tree of ShapeDtypeStructs with shardings."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def _leaves_per_chip(tree: Any, prefix: str) -> List[Tuple[str, int, Any]]:
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shape = leaf.sharding.shard_shape(leaf.shape)
        name = prefix + jax.tree_util.keystr(path, simple=True, separator="/")
        out.append((f"{name} {jnp.dtype(leaf.dtype).name}{list(shape)}",
                    math.prod(shape) * jnp.dtype(leaf.dtype).itemsize, leaf))
    return out


def _memory(compiled) -> Dict[str, int]:
    stats = compiled.memory_analysis()
    return {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
            "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
            "generated_code": stats.generated_code_size_in_bytes}


def hlo_flops(trainer: Trainer, batch: Dict[str, np.ndarray]) -> Optional[float]:
    """FLOPs of one train step by XLA's HLO cost analysis, for the whole batch: of the
    step as lowered (remat recomputation included), before partitioning and optimisation.

    XLA counts a loop body once, whatever its trip count, so scanned layers are lowered
    unrolled and microbatches as one batch for this count (a lowering, not a compile:
    seconds; the same arithmetic but the gradient accumulation's adds). None for a scanned
    model that its family's wrapper does not rebuild from its config and loss alone."""
    from jax._src import xla_bridge
    from jax._src.lib import _jax
    model, config = trainer.model, trainer.config
    if model.config.scan_layers:
        model = _unscanned(model)
        if model is None:
            return None
    if config.num_microbatches > 1:
        config = dataclasses.replace(config, num_microbatches=1)
    if model is not trainer.model or config is not trainer.config:
        trainer = Trainer(model, trainer.tx, trainer.mesh, config, trainer.schedule,
                          trainer.rules)
    lowered = trainer.lower_train_step(trainer.abstract_init(batch),
                                       trainer.abstract_batch(batch))
    module = lowered.compiler_ir("hlo").as_hlo_module()
    cost = _jax.hlo_module_cost_analysis(xla_bridge.get_backend("cpu"), module)
    return float(cost.get("flops", 0.0))


_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def _out_of_memory(error: Exception, state_bytes: Dict[str, int]) -> Tuple[Dict[str, int], str]:
    """XLA's TPU compiler refuses a program whose temporaries exceed HBM: memory from its
    message (temporaries) and the state's own per-chip bytes (arguments)."""
    text = str(error)
    match = re.search(r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available HBM "
                      r"\(([\d.]+)([KMGT]?)\)", text)
    if "RESOURCE_EXHAUSTED" not in text or not match:
        raise error
    temporaries = int(float(match.group(1)) * _UNITS[match.group(2)])
    memory = {"arguments": sum(state_bytes.values()), "outputs": 0, "aliased": 0,
              "temporaries": temporaries, "generated_code": 0}
    note = (f"XLA stopped compiling: the temporaries alone need {match.group(1)} "
            f"{match.group(2)}iB of the {match.group(3)} {match.group(4)}iB it can use; "
            "arguments are t2t's count")
    return memory, note


# ----------------------------------------------------------------------------- buffers

_VALUE = re.compile(r"^ value: <\d+ (\S+) @\S+> \(size=(\d+),offset=\d+\): (\S+)")
_ALLOCATION = re.compile(r"^allocation \d+: size \d+(.*)$")


def temporary_buffers(dump_dir: str, limit: int = 10) -> List[Tuple[str, int, str, str]]:
    """The largest values XLA placed outside the arguments: (instruction, bytes, shape,
    op_name), from the buffer assignment that `xla_dump_to` wrote."""
    found = sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations-buffer-assignment.txt")),
                   reverse=True)
    if not found:
        return []
    values: Dict[str, Tuple[int, str]] = {}
    kind = ""
    with open(found[0]) as f:
        for line in f:
            if line.startswith("allocation"):
                match = _ALLOCATION.match(line)
                kind = match.group(1) if match else ""
                continue
            match = _VALUE.match(line)
            if match and "parameter" not in kind and "constant" not in kind:
                name, size, shape = match.group(1), int(match.group(2)), match.group(3)
                if size > values.get(name, (0, ""))[0]:
                    values[name] = (size, shape.split("{")[0])
    top = sorted(values.items(), key=lambda kv: -kv[1][0])[:limit]
    names = {name for name, _ in top}
    ops = _op_names(dump_dir, names)
    return [(name, size, shape, ops.get(name, "")) for name, (size, shape) in top]


def _op_names(dump_dir: str, names: set) -> Dict[str, str]:
    found = sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations.txt")), reverse=True)
    ops: Dict[str, str] = {}
    if not found:
        return ops
    pattern = re.compile(r"^\s*(?:ROOT )?%(\S+) = .*?op_name=\"([^\"]*)\"")
    with open(found[0]) as f:
        for line in f:
            match = pattern.match(line)
            if match and match.group(1) in names:
                ops[match.group(1)] = match.group(2)
    return ops


def _short_op(op_name: str) -> str:
    op = re.sub(r"^jit\([^)]*\)/", "", op_name)
    return op if len(op) <= 90 else "..." + op[-87:]


def _temporary_knob(shape: str, trainer: Trainer) -> str:
    cfg = trainer.model.config
    dims = [int(d) for d in re.findall(r"\d+", shape.split("[", 1)[-1])]
    vocab_shard = cfg.vocab_size // trainer.mesh.shape["tensor"]
    if {cfg.vocab_size, vocab_shard} & set(dims):       # logits, or the embedding gathered
        return "tensor (MeshConfig.tensor splits the vocabulary)"
    layers = {cfg.num_encoder_layers, cfg.num_decoder_layers} - {0}
    stacked = cfg.scan_layers and len(dims) > 1 and dims[0] in layers  # saved per layer
    if stacked and cfg.remat_policy != "full":
        return "remat (TransformerConfig.remat_policy='full' saves only each layer's input)"
    return ("batch (BATCH_SIZE per chip, or TrainConfig.num_microbatches)"
            + ("" if cfg.remat_policy != "none" else " or remat (TransformerConfig.remat_policy)"))


def largest_buffers(trainer: Trainer, state, dump_dir: str, n: int = 3) -> List[Buffer]:
    """The `n` largest per-chip buffers: state leaves (named by their pytree path) and
    XLA's temporaries (named by their op), each with the knob that shrinks it."""
    fsdp = "fsdp (MeshConfig.fsdp shards it over more chips)"
    candidates = [Buffer(what, size, fsdp) for what, size, _ in
                  _leaves_per_chip(state.params, "params") + _leaves_per_chip(
                      state.opt_state, "opt_state")]
    for name, size, shape, op in temporary_buffers(dump_dir):
        what = f"temporary {shape} ({_short_op(op) or name})"
        candidates.append(Buffer(what, size, _temporary_knob(shape, trainer)))
    return sorted(candidates, key=lambda b: -b.bytes)[:n]


# ----------------------------------------------------------------------------- compiling


@contextlib.contextmanager
def _no_compilation_cache() -> Iterator[None]:
    """JAX's persistent cache cannot load executables of compile-only devices: skip it.
    JAX decides once per process whether the cache is in use, so the decision is reset on
    the way in and out (a process that already used the cache would otherwise read it)."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


def compile_train_step(trainer: Trainer, batch: Dict[str, np.ndarray], slice_: chips_lib.Slice,
                       num_slices: int = 1, step: str = "train") -> Report:
    """Lower and compile `trainer`'s train step for a global `batch`'s shapes on its mesh
    (whose devices are `slice_`'s); a Report of XLA's memory and FLOPs."""
    abstract_batch = trainer.abstract_batch(batch)
    state = trainer.abstract_init(batch)
    lowered = trainer.lower_train_step(state, abstract_batch)
    return _compiled_report(trainer, batch, state, abstract_batch, lowered, slice_, num_slices,
                            step, hlo_flops(trainer, batch) or 0.0,
                            train_step_flops(trainer, batch))


def _unscanned(model):
    """`model` rebuilt by its family with scan_layers=False; None when the family's wrapper
    does not rebuild it from (config, loss) alone (options of its own, a teacher)."""
    try:
        same = families.make_model(model.family, model.config, model.loss)
    except ValueError:
        return None
    if type(same) is not type(model) or same.module != model.module:
        return None
    return families.make_model(model.family, model.config.replace(scan_layers=False),
                               model.loss)


def train_step_flops(trainer: Trainer, batch: Dict[str, np.ndarray]) -> float:
    """Model FLOPs of one train step on the whole `batch` (t2t.train.flops; 0: a family the
    formula does not cover)."""
    family = trainer.model.family
    rows = next(iter(batch.values())).shape[0]
    try:
        return flops_lib.step_flops(trainer.model.config, family, rows,
                                    **batch_geometry(family, batch))
    except ValueError:
        return 0.0


def decode_options(family: str, batch: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """`model.predict`'s options for a compile of decoding: greedy, the target width for
    T5; for GPT (a family that continues a prompt) the first half of each row is the prompt
    and the rest is generated."""
    if not families.get(family).decoding.continues_prompt:
        return {"max_decode_length": batch["decoder_target_tokens"].shape[1]}
    rows, width = batch["decoder_input_tokens"].shape
    prompt = max(width // 2, 1)
    return {"max_decode_length": width - prompt,
            "prompt_lengths": np.full((rows,), prompt, np.int32)}


def compile_decode_step(trainer: Trainer, batch: Dict[str, np.ndarray],
                        slice_: chips_lib.Slice, num_slices: int = 1) -> Report:
    """Greedy decoding as `t2t infer` and evaluation run it (`model.predict`: encode or
    prefill once, then one token at a time on the KV cache), for the global `batch`'s rows
    and lengths, with the parameters sharded as in training; a Report of XLA's memory (the
    cache is among the temporaries). FLOPs are not counted: XLA's cost analysis counts a
    loop body once."""
    family = trainer.model.family
    if families.get(family).decoding is None:
        decoders = families.names(lambda f: f.decoding, variants=False)
        raise TopologyError(f"--step=decode needs a family that decodes "
                            f"({', '.join(decoders)}); this config's is {family!r}")
    abstract_batch = trainer.abstract_batch(batch)
    state = trainer.abstract_init(batch)
    state = TrainState(state.step, state.params, ())      # no optimizer when decoding
    options = decode_options(family, batch)
    model = trainer.model
    decode = jax.jit(lambda params, b: model.predict(params, b, **options),
                     in_shardings=(trainer.state_shardings.params,
                                   {k: v.sharding for k, v in abstract_batch.items()}))
    with partitioning.sharding_context(trainer.mesh, trainer.rules):
        lowered = decode.lower(state.params, abstract_batch)
    return _compiled_report(trainer, batch, state, abstract_batch, lowered, slice_, num_slices,
                            "decode", xla_flops=0.0, model_flops=0.0)


def _compiled_report(trainer: Trainer, batch: Dict[str, np.ndarray], state, abstract_batch,
                     lowered, slice_: chips_lib.Slice, num_slices: int, step: str,
                     xla_flops: float, model_flops: float) -> Report:
    """Compile `lowered` for the slice and read its memory; the step's FLOPs (0: not
    counted) are given."""
    state_bytes = {"parameters": _bytes_per_chip(state.params),
                   "optimizer_state": _bytes_per_chip(state.opt_state),
                   "batch": _bytes_per_chip(abstract_batch)}
    with tempfile.TemporaryDirectory(prefix="t2t-compile-") as dump, _no_compilation_cache():
        try:
            compiled = lowered.compile({"xla_dump_to": dump})
            memory, note = _memory(compiled), ""
        except jax.errors.JaxRuntimeError as e:      # XLA stops when temporaries alone
            compiled, memory, note = None, *_out_of_memory(e, state_bytes)   # exceed HBM
        largest = largest_buffers(trainer, state, dump)
    family = trainer.model.family
    num_chips = len(trainer.mesh.devices.flat)
    return Report(
        step=step, slice=slice_, num_slices=num_slices, mesh=dict(trainer.mesh.shape),
        family=family, num_params=sum(math.prod(x.shape) for x in jax.tree.leaves(state.params)),
        batch_shapes={k: tuple(v.shape) for k, v in batch.items()},
        state_bytes=state_bytes, memory=memory, note=note,
        xla_flops=xla_flops / num_chips,
        model_flops=model_flops,
        largest=largest, train_steps=trainer.config.train_steps, compiled=compiled)


def target_from_config(topology: Optional[str], num_slices: Optional[int]
                       ) -> Tuple[str, int]:
    """--topology / --num_slices, else the hardware config's TPU_TOPOLOGY / TPU_NUM_SLICES."""
    from t2t.run import gin_utils
    topology = topology or gin_utils.query_macro("TPU_TOPOLOGY")
    if not topology:
        raise TopologyError("no --topology given and the config names no TPU_TOPOLOGY: "
                            "add --topology=v5e-256 (or include a configs/hardware/tpu_* file)")
    if num_slices is None:
        num_slices = int(gin_utils.query_macro("TPU_NUM_SLICES") or 1)
    return str(topology), num_slices


@dataclasses.dataclass
class Prepared:
    """A gin-configured step built abstractly over a slice's compile-only devices, before
    anything compiles (`prepare`): what `compile_prepared` lowers."""

    step: str
    trainer: Trainer
    batch: Dict[str, np.ndarray]
    slice: chips_lib.Slice
    num_slices: int

    def signature(self) -> Dict[str, Any]:
        """What the compiled step depends on beyond gin's bindings: the parameters' and the
        batch's shapes and dtypes, the mesh (a classifier's label count shows here)."""
        state = self.trainer.abstract_init(self.batch)
        params = {jax.tree_util.keystr(path): [list(leaf.shape), str(leaf.dtype)]
                  for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
        return {"step": self.step, "topology": self.slice.name, "num_slices": self.num_slices,
                "mesh": dict(self.trainer.mesh.shape), "params": params,
                "batch": {k: [list(v.shape), str(v.dtype)] for k, v in self.batch.items()}}


def prepare(topology: str, num_slices: int = 1, step: str = "train") -> Prepared:
    """The gin-configured `step` ("train", "finetune", "decode") built for `num_slices`
    slices of `topology` (e.g. "v5e-256"), abstract: nothing is allocated or compiled. A
    request that cannot work (unknown slice, a mesh that does not multiply to its chips, a
    batch the data axes do not divide) is one TopologyError."""
    if step not in STEPS:
        raise TopologyError(f"unknown step {step!r}; choose one of {', '.join(STEPS)}")
    if num_slices < 1:
        raise TopologyError(f"--num_slices must be >= 1, got {num_slices}")
    slice_ = chips_lib.parse(topology)
    where = slice_.name + (f" x {num_slices} slices" if num_slices > 1 else "")
    _check_slices(num_slices, where)
    devices = chips_lib.topology_devices(slice_, num_slices)
    try:
        with partitioning.target_devices(devices):
            exp, batch = build("train" if step == "decode" else step)
        trainer = exp.trainer
        trainer.abstract_batch(batch)           # checks the batch divides the data axes
        trainer.abstract_init(batch)            # and every parameter its mesh axes
    except ValueError as e:
        message = str(e).splitlines()[0]
        if isinstance(e, UserError) or not any(
                word in message for word in ("mesh", "divisible", "DCN", "devices")):
            raise
        raise TopologyError(f"{message} (on {where}: {len(devices)} chips)") from None
    return Prepared(step, trainer, batch, slice_, num_slices)


def compile_prepared(prepared: Prepared) -> Report:
    """Lower and compile a prepared step with XLA's TPU compiler; its Report."""
    p = prepared
    if p.step == "decode":
        return compile_decode_step(p.trainer, p.batch, p.slice, p.num_slices)
    return compile_train_step(p.trainer, p.batch, p.slice, p.num_slices, p.step)


def compile_for(topology: str, num_slices: int = 1, step: str = "train") -> Report:
    """`prepare` then `compile_prepared`: the step `t2t compile` reports on."""
    return compile_prepared(prepare(topology, num_slices, step))


def _check_slices(num_slices: int, where: str) -> None:
    """Several slices: the mesh must span them over DCN (MeshConfig.dcn_*)."""
    from t2t.run.configurables import MeshConfig
    cfg = MeshConfig()
    dcn = math.prod(cfg.dcn_shape)
    if dcn != num_slices:
        raise TopologyError(f"{where}: MeshConfig.dcn_data x dcn_fsdp x dcn_tensor = {dcn} "
                         f"slices, but --num_slices={num_slices}; bind MeshConfig.dcn_data="
                         f"{num_slices} (or a hardware config for {num_slices} slices)")
