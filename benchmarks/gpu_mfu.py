"""Issue 60's accelerator run: MFU of t2t's pretraining steps, best levers against the
previous configuration, each at the largest batch that fits, in one bounded call.

Stages, each in a process of its own with a time limit (a stage that overruns is killed and
reported, and the run goes on with the next): the bf16 matmul peak (``flops.
measure_peak_flops``, 8192^3 on a GPU), then for each model x configuration a batch search
and a timed step:

  t5    T5.1.1-large span corruption, batch x (512 inputs + 114 targets)
  bert  BERT-large MLM + NSP, batch x 128 tokens, 20 masked positions
  gpt   GPT-2 medium causal LM, batch x 1,024 tokens

Batch search: one step is compiled and timed at a probe batch (one expected to fit, so its
row is a fair one when nothing larger fits the stage's time); XLA's memory analysis
of that executable (arguments + outputs - aliased + temporaries) predicts the bytes of a
larger batch (activations grow with it, parameters and optimizer state do not), and the
largest candidate predicted to fit the device's memory (``bytes_limit``) is compiled; if
its own analysis or its first step says it does not fit, the next one down is tried while
the stage's time allows, and the probe's timing stands when none fits. The state is
initialised once, at the probe, and carried on (parameter shapes do not depend on the
batch). Timed steps: ``--steps`` after ``--warmup``, each waited for; the median.

Configurations (``--configs``; TransformerConfig/TrainConfig overrides of the presets
``models/t5/1_1/large.gin``, ``models/bert/large.gin``, ``models/gpt2/medium.gin``):
%(configs)s

``--xla-variant`` adds one named set of XLA flags to XLA_FLAGS for every stage (%(variants)s),
so that a second call measures one of them; flags this jaxlib does not know fail the peak
stage, which then says so.

``--tiny`` is the same run on the CPU at tiny sizes (2-layer models of width 64, short
sequences, the "cudnn" kernel (JAX's XLA version here), probe batch 2 and candidates 8
and 4, every stage in one process) with ``--limit-at-batch 2``: the device is taken to hold
what batch 2 needs, so the search predicts 8 and 4 not to fit and compiles one step per
stage (``--limit-at-batch 4`` also compiles and times batch 4).
tests/train/test_gpu_mfu.py runs it.

    python benchmarks/gpu_mfu.py [--models t5,bert,gpt] [--configs previous,best]
        [--budget 500] [--out DIR] [--xla-variant NAME] [--results-md PATH] [--no-write]
    python benchmarks/gpu_mfu.py --tiny --out /tmp/mfu_tiny --results-md /tmp/R.md
    bash benchmarks/gpu_mfu.sh     # on the GPU machine: wheels, nvidia-smi, logs to $OUT
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = 2 ** 30
MARGIN = 0.95              # a batch predicted above this share of the limit is not compiled


@dataclasses.dataclass(frozen=True)
class Workload:
    title: str
    family: str
    preset: str
    inputs: int                 # encoder tokens (T5, BERT) or decoder tokens (GPT)
    targets: int = 0            # T5's decoder tokens
    masked: int = 0             # BERT's masked positions
    probe: int = 8              # the first batch compiled and timed
    candidates: tuple = ()      # larger batches the search may jump to
    weight: float = 1.0         # its share of the time budget


# Probes near what is expected to fit (T5: batch 64 ran without remat on an H200 at 75% of
# its memory; batch 128 did not), so that the probe's row is a fair one when no jump fits
# the stage's time.
WORKLOADS = {
    "t5": Workload("T5.1.1-large span corruption", "t5", "models/t5/1_1/large.gin", 512, 114,
                   probe=64, candidates=(256, 192, 160, 128, 96), weight=1.8),
    "bert": Workload("BERT-large MLM+NSP", "bert", "models/bert/large.gin", 128, masked=20,
                     probe=256, candidates=(1024, 768, 512, 384), weight=1.0),
    "gpt": Workload("GPT-2 medium LM", "gpt", "models/gpt2/medium.gin", 1024,
                    probe=16, candidates=(96, 64, 48, 32, 24), weight=1.2),
}
TINY_SIZES = dict(d_model=64, num_heads=4, head_dim=16, d_ff=128, vocab_size=512)
TINY = {"t5": dict(inputs=32, targets=8, layers=dict(num_encoder_layers=2,
                                                     num_decoder_layers=2)),
        "bert": dict(inputs=32, masked=5, layers=dict(num_encoder_layers=2)),
        "gpt": dict(inputs=32, layers=dict(num_decoder_layers=2))}

PREVIOUS = dict(dtype="bfloat16", scan_layers=True)
BEST = dict(PREVIOUS, attention_structure=True, loss_chunk_tokens=8192)


@dataclasses.dataclass(frozen=True)
class Setup:
    about: str
    model: dict
    train: dict = dataclasses.field(default_factory=dict)


CONFIGS = {
    "previous": Setup("as benchmarks/gpu_step.sh ran t2t_bf16_scan: bf16 matmuls (float32 "
                      "params and accumulation), scanned layers, the presets' dropout, cuDNN "
                      "attention where it can run (not under attention dropout), dense masks",
                      PREVIOUS),
    "best": Setup("the levers: cuDNN told is_causal and lengths, T5's bias unbroadcast "
                  "(attention_structure), the loss in chunks of 8,192 tokens "
                  "(loss_chunk_tokens), dropout masks from unsafe_rbg, and no "
                  "attention-probability dropout (BERT, GPT-2: cuDNN has none; hidden "
                  "dropout 0.1 stays)",
                  dict(BEST, attention_dropout_rate=0.0), dict(dropout_rng_impl="unsafe_rbg")),
    "levers": Setup("the levers with the presets' attention dropout (BERT and GPT-2 "
                    "attention then on XLA)", BEST, dict(dropout_rng_impl="unsafe_rbg")),
    "best_remat": Setup("best plus remat_policy='save_qkv_out_proj'",
                        dict(BEST, attention_dropout_rate=0.0,
                             remat_policy="save_qkv_out_proj"),
                        dict(dropout_rng_impl="unsafe_rbg")),
    "best_nochunk": Setup("best without the loss chunks",
                          dict(BEST, attention_dropout_rate=0.0, loss_chunk_tokens=0),
                          dict(dropout_rng_impl="unsafe_rbg")),
}

# XLA GPU flags as MaxText's and JAX-Toolbox's GPU recipes set them (one-GPU relevant).
VARIANTS = {
    "default": (),
    "lhs": ("--xla_gpu_enable_latency_hiding_scheduler=true",),
    "no_triton_gemm": ("--xla_gpu_enable_triton_gemm=false",),
    "no_command_buffer": ("--xla_gpu_enable_command_buffer=",),
    "while_double_buffer": ("--xla_gpu_enable_while_loop_double_buffering=true",),
    "no_xla_remat": ("--xla_disable_hlo_passes=rematerialization",),
    "maxtext": ("--xla_gpu_enable_latency_hiding_scheduler=true",
                "--xla_gpu_enable_triton_gemm=false",
                "--xla_gpu_enable_command_buffer=",
                "--xla_gpu_enable_highest_priority_async_stream=true",
                "--xla_gpu_enable_while_loop_double_buffering=true",
                "--xla_disable_hlo_passes=rematerialization"),
}
PEAK_SECONDS = 45          # the peak stage's limit (JAX's start-up is most of it)
GRACE_SECONDS = 10         # past a stage's limit before its process is killed

__doc__ = __doc__ % {
    "configs": "\n".join(f"  {name:<13} {setup.about}" for name, setup in CONFIGS.items()),
    "variants": ", ".join(VARIANTS)}


# ============================================================================ the worker
def _workload(model: str, tiny: bool) -> Workload:
    w = WORKLOADS[model]
    if not tiny:
        return w
    t = TINY[model]
    return dataclasses.replace(w, title=f"{w.title} (tiny)", inputs=t["inputs"],
                               targets=t.get("targets", 0), masked=t.get("masked", 0),
                               probe=2, candidates=(8, 4))


def preset_bindings(preset: str) -> dict:
    """`TransformerConfig.name = value` of a model preset under t2t/configs/ and the files
    it includes (read here: t2t.run's gin layer imports the data pipeline's packages,
    which the GPU machine's Python may lack)."""
    import ast
    import re
    from t2t.nn import config as nn_config
    root = Path(nn_config.__file__).resolve().parent.parent / "configs"
    bindings: dict = {}
    for line in (root / preset).read_text().splitlines():
        line = line.split("#")[0].strip()
        include = re.fullmatch(r"include\s+'([^']+)'", line)
        binding = re.fullmatch(r"TransformerConfig\.(\w+)\s*=\s*(.+)", line)
        if include:
            bindings.update(preset_bindings(include.group(1)))
        elif binding:
            bindings[binding.group(1)] = ast.literal_eval(binding.group(2))
    return bindings


def model_config(model: str, config: str, tiny: bool):
    """The preset's TransformerConfig with the configuration's overrides (and, `tiny`,
    tiny sizes, and the "cudnn" kernel so the CPU runs the device's attention call)."""
    from t2t.nn.config import TransformerConfig
    cfg = TransformerConfig(**preset_bindings(WORKLOADS[model].preset))
    if tiny:
        cfg = cfg.replace(**TINY_SIZES, **TINY[model]["layers"], attention_kernel="cudnn")
    return cfg.replace(**CONFIGS[config].model)


def make_batch(w: Workload, batch: int, vocab: int, seed: int = 0) -> dict:
    """Random full rows (no padding, no packing), as benchmarks/train_step.py's."""
    import numpy as np
    rng = np.random.default_rng(seed)
    if w.family == "bert":
        n, m = w.inputs, w.masked
        tokens = rng.integers(5, vocab, (batch, n), dtype=np.int32)
        positions = np.sort(np.argsort(rng.random((batch, n - 1)), axis=1)[:, :m] + 1,
                            axis=1).astype(np.int32)
        ids = np.take_along_axis(tokens, positions, 1)
        types = np.zeros((batch, n), np.int32)
        types[:, n // 2:] = 1
        return {"encoder_input_tokens": tokens, "token_type_ids": types,
                "masked_positions": positions, "masked_ids": ids.astype(np.int32),
                "masked_weights": np.ones((batch, m), np.float32),
                "next_sentence_labels": rng.integers(0, 2, (batch,), dtype=np.int32)}
    if w.family == "t5":
        targets = rng.integers(2, vocab, (batch, w.targets), dtype=np.int32)
        return {"encoder_input_tokens": rng.integers(2, vocab, (batch, w.inputs),
                                                     dtype=np.int32),
                "decoder_input_tokens": np.concatenate(
                    [np.zeros((batch, 1), np.int32), targets[:, :-1]], 1),
                "decoder_target_tokens": targets,
                "decoder_loss_weights": np.ones((batch, w.targets), np.float32)}
    tokens = rng.integers(0, vocab, (batch, w.inputs + 1), dtype=np.int32)
    return {"decoder_input_tokens": tokens[:, :-1], "decoder_target_tokens": tokens[:, 1:],
            "decoder_loss_weights": np.ones((batch, w.inputs), np.float32)}


def step_flops(w: Workload, cfg, batch: int) -> float:
    from t2t.train import flops
    if w.family == "bert":
        return flops.step_flops(cfg, "bert", batch, input_length=w.inputs,
                                num_masked=w.masked)
    if w.family == "t5":
        return flops.step_flops(cfg, "t5", batch, input_length=w.inputs,
                                target_length=w.targets)
    return flops.step_flops(cfg, "gpt", batch, target_length=w.inputs)


def is_out_of_memory(error: BaseException) -> bool:
    text = f"{type(error).__name__} {error}".lower()
    return any(s in text for s in ("resource_exhausted", "out of memory", "resource exhausted",
                                   "can't reduce memory", "failed to allocate"))


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def needed_bytes(analysis) -> int:
    """What an executable holds at once by XLA's analysis: its arguments, its outputs that
    do not reuse a donated argument, and its temporaries."""
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
               - analysis.alias_size_in_bytes + analysis.temp_size_in_bytes)


class Predictor:
    """Bytes a batch needs: a fixed part plus a part linear in the batch, from one compiled
    batch (its temporaries less the float32 gradients taken to grow with the batch; the
    gradients are a quarter of AdamW's state arguments) or a line through two."""

    def __init__(self):
        self.points: Dict[int, int] = {}
        self.fixed_floor = 0

    def add(self, batch: int, analysis) -> int:
        need = needed_bytes(analysis)
        if not self.points:
            self.fixed_floor = needed_bytes(analysis) - analysis.temp_size_in_bytes + int(
                analysis.argument_size_in_bytes) // 4
        self.points[batch] = need
        return need

    def __call__(self, batch: int) -> float:
        (b0, n0), *more = sorted(self.points.items())
        if more:
            b1, n1 = more[-1]
            slope = max((n1 - n0) / (b1 - b0), 0.0)
        else:
            slope = max(n0 - self.fixed_floor, 0) / b0
        return n0 + slope * (batch - b0)


class Stage:
    """One model x configuration: build, search, time. `limit_bytes` None: no limit known
    (then the largest candidate is taken); `limit_at_batch`: the limit is what that batch
    is predicted to need (for the CPU run)."""

    def __init__(self, model: str, config: str, *, tiny: bool, deadline: float,
                 warmup: int, steps: int, limit_at_batch: Optional[int], log):
        import jax
        import optax
        from t2t.models.base import LossConfig
        from t2t.models.families import make_model
        from t2t.train.partitioning import MeshConfig, make_mesh
        from t2t.train.trainer import TrainConfig, Trainer

        self.model, self.config, self.log = model, config, log
        self.deadline, self.warmup, self.steps = deadline, warmup, steps
        self.w = _workload(model, tiny)
        self.cfg = model_config(model, config, tiny)
        loss = LossConfig(z_loss=0.0) if self.w.family == "bert" else LossConfig()
        mesh = make_mesh(MeshConfig(), devices=jax.devices()[:1])
        self.trainer = Trainer(make_model(self.w.family, self.cfg, loss),
                               optax.adamw(1e-4, weight_decay=0.01), mesh,
                               TrainConfig(model_dir=tempfile.mkdtemp(), progress_bar=False,
                                           **CONFIGS[config].train))
        stats = jax.devices()[0].memory_stats() or {}
        self.limit = stats.get("bytes_limit")
        self.limit_at_batch = limit_at_batch
        self.tried: List[dict] = []
        self.state = self.abstract = None
        self.last_compile_s = 0.0

    def _compile(self, batch: int):
        example = make_batch(self.w, batch, self.cfg.vocab_size)
        t0 = time.perf_counter()
        if self.abstract is None:          # the state's shapes do not depend on the batch
            self.abstract = self.trainer.abstract_init(example)
        abstract = self.abstract
        compiled = self.trainer.lower_train_step(
            abstract, self.trainer.abstract_batch(example)).compile()
        seconds = self.last_compile_s = time.perf_counter() - t0
        analysis = compiled.memory_analysis()
        self.log(f"    batch {batch}: compiled in {seconds:.1f} s, XLA needs "
                 f"{needed_bytes(analysis) / GIB:.3f} GiB")
        return compiled, example, abstract, analysis, seconds

    def _time(self, compiled, example, abstract) -> List[float]:
        import jax
        if self.state is None:
            self.state = random_state(self.trainer, abstract)
        batch = self.trainer.global_batch(example)
        times = []
        for i in range(self.warmup + self.steps):
            t0 = time.perf_counter()
            self.state, metrics = compiled(self.state, batch)
            jax.block_until_ready(metrics["loss"])
            if i >= self.warmup:
                times.append(time.perf_counter() - t0)
        loss = float(metrics["loss"])
        if loss != loss:
            raise FloatingPointError(f"the loss is NaN at batch {example_rows(example)}")
        return times

    def _attempt(self, batch: int, predictor: Predictor) -> Optional[dict]:
        """The timed result at `batch`, or None (recorded why)."""
        try:
            compiled, example, abstract, analysis, compile_s = self._compile(batch)
            need = predictor.add(batch, analysis)
            limit = self._limit(predictor)
            if limit is not None and need > limit:
                self.tried.append(dict(batch=batch, outcome=f"needs {_num(need / GIB)} GiB"
                                       f" > {_num(limit / GIB)}"))
                return None
            times = self._time(compiled, example, abstract)
        except Exception as e:   # noqa: BLE001 - out of memory (or worse): the next batch
            self.tried.append(dict(batch=batch, outcome=("out of memory"
                                                         if is_out_of_memory(e)
                                                         else _first_line(e))))
            self.log(f"    batch {batch}: {self.tried[-1]['outcome']}")
            self.state = None          # a failed step may have consumed the donated state
            return None
        step = statistics.median(times)
        self.tried.append(dict(batch=batch, outcome=f"{step * 1e3:.1f} ms"))
        self.log(f"    batch {batch}: {step * 1e3:.1f} ms a step (median of {len(times)})")
        return dict(batch=batch, step_s=step, step_times=times, need_bytes=need,
                    compile_s=compile_s)

    def _limit(self, predictor: Predictor) -> Optional[float]:
        """The bytes a step may take: 97% of the device's limit; with `limit_at_batch`,
        what that batch is predicted to need, over the search's 95% margin."""
        if self.limit_at_batch is not None and predictor.points:
            return predictor(self.limit_at_batch) / MARGIN * 1.001
        return None if self.limit is None else 0.97 * self.limit

    def _estimate(self, best: dict, batch: int) -> float:
        """Seconds another attempt at `batch` may take: a compile like the last one, and
        its steps at the measured time per row (the state is carried, not made again)."""
        steps = (self.warmup + self.steps) * best["step_s"] * batch / best["batch"]
        return 1.1 * self.last_compile_s + steps + 2.0

    def run(self) -> dict:
        w = self.w
        predictor = Predictor()
        best = None
        for probe in (w.probe, max(1, w.probe // 2), max(1, w.probe // 4)):
            best = self._attempt(probe, predictor)
            if best is not None or probe == 1:
                break
        if best is not None:
            limit = self._limit(predictor)
            for batch in sorted((b for b in w.candidates if b > best["batch"]), reverse=True):
                guess = predictor(batch)
                if limit is not None and guess > MARGIN * limit:
                    self.tried.append(dict(batch=batch, outcome=f"predicted "
                                           f"{_num(guess / GIB)} GiB > {_num(limit / GIB)}"))
                    continue
                if time.time() + self._estimate(best, batch) > self.deadline:
                    self.tried.append(dict(batch=batch, outcome="no time left"))
                    break
                result = self._attempt(batch, predictor)
                if result is not None:
                    best = result
                    break
                limit = self._limit(predictor)
        out = dict(model=self.model, config=self.config, title=w.title, tried=self.tried,
                   tokens_per_example=w.inputs + w.targets,
                   memory_limit_bytes=self.limit)
        if best is None:
            return dict(out, error="no batch ran: " + "; ".join(
                f"{t['batch']}: {t['outcome']}" for t in self.tried))
        flops_per_step = step_flops(w, self.cfg, best["batch"])
        return dict(out, **best, flops_per_step=flops_per_step,
                    tokens_per_step=best["batch"] * (w.inputs + w.targets))


def random_state(trainer, abstract):
    """A train state shaped and sharded as `abstract` (Trainer.abstract_init's): parameters
    of scale 0.02 that vary from element to element (0.02 sin(0.618 i + leaf); constant
    inputs run faster than real data on some accelerators), AdamW's moments and counts
    zero, as its init makes them. The model's own init (a traced flax program, threefry
    per leaf) costs seconds per model and says nothing about the step's speed."""
    import jax
    import jax.numpy as jnp

    def make():
        leaves, tree = jax.tree_util.tree_flatten(abstract.params)
        params = tree.unflatten([
            (0.02 * jnp.sin(jnp.arange(x.size, dtype=jnp.float32) * 0.618 + i))
            .reshape(x.shape).astype(x.dtype) for i, x in enumerate(leaves)])
        zeros = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype),
                                       (abstract.step, abstract.opt_state))
        return abstract.replace(step=zeros[0], params=params, opt_state=zeros[1])

    return jax.jit(make, out_shardings=trainer.state_shardings)()


def example_rows(example: dict) -> int:
    return next(iter(example.values())).shape[0]


def peak_stage(tiny: bool) -> dict:
    import jax
    from t2t.train import flops
    device = jax.devices()[0]
    size = 256 if tiny else 8192
    return dict(peak_flops=flops.measure_peak_flops("bfloat16", size=size), peak_size=size,
                device_kind=device.device_kind, platform=device.platform,
                jax=jax.__version__)


def worker(args) -> int:
    """Run `args.stages` in order, one JSON line each (after a "start" line) to
    `args.results`, stopping a stage's batch search at its deadline."""
    import _common  # noqa: F401 - picks JAX's platforms before JAX starts
    budgets = dict(zip(args.stages.split(","), map(float, args.budgets.split(","))))

    def log(text):
        print(text, flush=True)

    with open(args.results, "a") as out:
        for stage, budget in budgets.items():
            out.write(json.dumps({"stage": stage, "event": "start", "time": time.time()}) + "\n")
            out.flush()
            t0 = time.time()
            log(f"  [{stage}] started (limit {budget:.0f} s)")
            if stage == "peak":
                result = peak_stage(args.tiny)
            else:
                model, config = stage.split(":")
                result = Stage(model, config, tiny=args.tiny, deadline=t0 + budget,
                               warmup=args.warmup, steps=args.steps,
                               limit_at_batch=args.limit_at_batch, log=log).run()
            result.update(stage=stage, event="done", seconds=time.time() - t0)
            out.write(json.dumps(result) + "\n")
            out.flush()
            log(f"  [{stage}] done in {result['seconds']:.0f} s")
    return 0


# ====================================================================== the orchestrator
def stages(models: List[str], configs: List[str]) -> List[str]:
    """The peak, then each model x configuration, the cheapest models first: the time a
    stage leaves unused goes to the stages after it, and T5's are the longest."""
    order = sorted(models, key=lambda m: WORKLOADS[m].weight)
    return ["peak"] + [f"{m}:{c}" for m in order for c in configs]


def share(pending: List[str], seconds: float) -> Dict[str, float]:
    """{stage: seconds} of `seconds` left for the `pending` stages: the peak's fixed
    share, the rest by the workloads' weights less each stage's grace (recomputed before
    each stage, so that time one stage leaves goes to the others)."""
    models = [s for s in pending if s != "peak"]
    peak = {"peak": float(PEAK_SECONDS)} if "peak" in pending else {}
    weights = {s: WORKLOADS[s.split(":")[0]].weight for s in models}
    left = max(seconds - sum(peak.values()) - GRACE_SECONDS * len(models),
               10.0 * len(models))
    total = sum(weights.values()) or 1.0
    return {**peak, **{s: left * weights[s] / total for s in models}}


def plan(models: List[str], configs: List[str], budget: float) -> Dict[str, float]:
    """The budgets of a run where every stage takes its whole share."""
    return share(stages(models, configs), budget)


def read_results(path: Path) -> List[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_stages(args, order: List[str], env: dict, log_file) -> Dict[str, dict]:
    """Workers over the stages (each in its own process; --tiny: one process for all); a
    stage past its share of the time left (plus grace) is killed, a worker that died is
    reported with its log's last lines, and a new worker takes the stages after it."""
    results_path = Path(args.out) / "results.jsonl"
    results_path.unlink(missing_ok=True)
    pending = list(order)
    done: Dict[str, dict] = {}
    start = time.time()
    per_worker = len(pending) if args.tiny else 1
    while pending:
        left = start + args.budget - time.time()
        if left < 10.0 * len(pending):
            for stage in pending:
                done[stage] = dict(stage=stage, error="not run: the time budget was spent")
            break
        batch = pending[:per_worker]
        budgets = share(pending, left)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--stages",
               ",".join(batch), "--budgets", ",".join(f"{budgets[s]:.0f}" for s in batch),
               "--results", str(results_path), "--warmup", str(args.warmup),
               "--steps", str(args.steps)]
        if args.tiny:
            cmd.append("--tiny")
        if args.limit_at_batch is not None:
            cmd += ["--limit-at-batch", str(args.limit_at_batch)]
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True)
        current, since, killed = None, time.time(), False
        while True:
            code = proc.poll()
            events = [r for r in read_results(results_path) if r.get("stage") in batch]
            for r in events:
                if r["event"] == "done" and r["stage"] not in done:
                    done[r["stage"]] = r
                    _progress(r, start)
                elif r["event"] == "start" and r["stage"] not in done and current != r["stage"]:
                    current, since = r["stage"], r["time"]
                    print(f"[{time.time() - start:5.0f} s] {current}: started", flush=True)
            if code is not None:
                break
            limit = budgets.get(current, PEAK_SECONDS) + GRACE_SECONDS
            if current is not None and current not in done and time.time() - since > limit:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                done[current] = dict(stage=current, error=f"killed after {limit:.0f} s")
                _progress(done[current], start)
                killed = True
                break
            time.sleep(0.2)
        unfinished = [s for s in batch if s not in done]
        if unfinished and not killed:     # the worker ended inside (or before) a stage
            stage = current if current in unfinished else unfinished[0]
            log_file.flush()
            done[stage] = dict(stage=stage, error=f"its process exited with {code}: "
                               + _tail(Path(args.out) / "stages.log"))
            _progress(done[stage], start)
        pending = [s for s in pending if s not in done]
        if "peak" in done and "error" in done["peak"]:
            for stage in pending:
                done[stage] = dict(stage=stage, error="not run: the peak stage failed")
            break
    return done


def _tail(path: Path, lines: int = 2) -> str:
    """The last lines of a log, joined (why a process ended: an unknown XLA flag, ...)."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " / ".join(line.strip()[:300] for line in text[-lines:])


def _progress(result: dict, start: float) -> None:
    stage = result["stage"]
    if "error" in result:
        text = f"FAILED: {result['error']}"
    elif stage == "peak":
        text = (f"{result['device_kind']}: bf16 peak {result['peak_flops'] / 1e12:.1f} "
                f"TFLOP/s")
    else:
        tried = ", ".join(f"{t['batch']} {t['outcome']}" for t in result["tried"])
        text = f"batch {result['batch']}, {result['step_s'] * 1e3:.1f} ms a step ({tried})"
    print(f"[{time.time() - start:5.0f} s] {stage}: {text}", flush=True)


def _num(x: float) -> str:
    """One decimal, or three significant digits below 10 (the tiny run's numbers)."""
    return f"{x:,.1f}" if x >= 10 else f"{x:.3g}"


def table(done: Dict[str, dict], models: List[str], configs: List[str]) -> str:
    import _common
    peak = done.get("peak", {}).get("peak_flops")
    rows = []
    for model in models:
        for config in configs:
            r = done.get(f"{model}:{config}", {})
            title = r.get("title", WORKLOADS[model].title)
            if "step_s" not in r:
                rows.append([title, config, "–", "–", "–", "–", "–", "–",
                             r.get("error", "not run")])
                continue
            tflops = r["flops_per_step"] / r["step_s"] / 1e12
            mfu = f"{100 * r['flops_per_step'] / r['step_s'] / peak:.1f}%" if peak else "–"
            search = "; ".join(f"{t['batch']}: {t['outcome']}" for t in r["tried"])
            rows.append([title, config, r["batch"], f"{r['step_s'] * 1e3:,.1f}",
                         f"{r['tokens_per_step'] / r['step_s']:,.0f}", _num(tflops), mfu,
                         _num(r["need_bytes"] / GIB), search])
    header = ["model", "config", "batch", "step ms", "tokens/s", "model TFLOP/s", "MFU",
              "XLA GiB", "batch search"]
    return _common.markdown_table(header, rows, "llrrrrrrl")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="t5,bert,gpt")
    p.add_argument("--configs", default="previous,best")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default 500; --tiny 300)")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_mfu"))
    p.add_argument("--xla-variant", default="default", choices=sorted(VARIANTS))
    p.add_argument("--results-md", default=None, help="the RESULTS.md to append to")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--tiny", action="store_true", help="the CPU run at tiny sizes")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--limit-at-batch", type=int, default=None,
                   help="take the device memory to be what this batch needs (--tiny: 2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stages", help=argparse.SUPPRESS)
    p.add_argument("--budgets", help=argparse.SUPPRESS)
    p.add_argument("--results", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    models, configs = args.models.split(","), args.configs.split(",")
    for name, known, what in ((models, WORKLOADS, "model"), (configs, CONFIGS, "config")):
        unknown = [n for n in name if n not in known]
        if unknown:
            p.error(f"unknown {what} {unknown}; choose from {sorted(known)}")
    args.budget = args.budget or (300.0 if args.tiny else 500.0)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 2)
    args.steps = args.steps or (2 if args.tiny else 5)
    if args.tiny and args.limit_at_batch is None:
        args.limit_at_batch = 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    flags = VARIANTS[args.xla_variant]
    if flags:
        env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), *flags]).strip()
    budgets = plan(models, configs, args.budget)
    print(f"gpu_mfu: {len(budgets)} stages in at most {args.budget:.0f} s (shares if each "
          f"takes all of its own: {', '.join(f'{s} {b:.0f} s' for s, b in budgets.items())}"
          f"); XLA variant {args.xla_variant!r}: {' '.join(flags) or '(none)'}; logs in "
          f"{out}", flush=True)
    t0 = time.time()
    with open(out / "stages.log", "a") as log_file:
        done = run_stages(args, list(budgets), env, log_file)
    body = report(args, argv, done, models, configs, flags, time.time() - t0)
    (out / "table.md").write_text(body + "\n")
    (out / "results.json").write_text(json.dumps(done, indent=1) + "\n")
    print(body, flush=True)
    if not args.no_write:
        import _common
        if args.results_md:
            _common.RESULTS = Path(args.results_md)
        kind = done.get("peak", {}).get("device_kind", "an unknown device")
        _common.append_results(f"Issue 60: MFU of the pretraining steps on one {kind}"
                               + (" (tiny, CPU)" if args.tiny else ""), body)
    return 0 if all("error" not in r for r in done.values()) else 1


def report(args, argv, done, models, configs, flags, seconds) -> str:
    import _common
    peak = done.get("peak", {})
    command = shlex.join(sys.argv[1:] if argv is None else argv)
    lines = [_common.machine_line("jax", "jaxlib", "flax", "optax")
             + f" Device: {peak.get('device_kind', 'unknown')} ({peak.get('platform', '?')}).",
             f"Command: `python benchmarks/gpu_mfu.py {command}` ({seconds:.0f} s); XLA "
             f"variant `{args.xla_variant}`" + (f" ({' '.join(flags)})" if flags else "")
             + f"; XLA_FLAGS `{os.environ.get('XLA_FLAGS', '')}`; "
             f"XLA_PYTHON_CLIENT_MEM_FRACTION "
             f"{os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION', 'unset (0.75)')}.",
             "bf16 matmul peak: " + (f"{peak['peak_flops'] / 1e12:,.1f} TFLOP/s "
                                     f"({peak['peak_size']}^3, measured in this run)"
                                     if "peak_flops" in peak else
                                     f"not measured ({peak.get('error', 'not run')})")
             + f"; step: median of {args.steps} after {args.warmup} warm-up, float32 "
             f"params, AdamW; model FLOPs from `t2t.train.flops.step_flops` (BERT: MLM "
             f"logits at the 20 masked positions); `XLA GiB`: the executable's arguments + "
             f"outputs - aliased + temporaries.",
             "Configs: " + "; ".join(f"`{c}`: {CONFIGS[c].about}" for c in configs) + ".",
             "", table(done, models, configs)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
