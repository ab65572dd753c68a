"""The training loop: one jitted, donated, sharded step; metrics; checkpoints; resume.

Resume is exact: the dropout rng of step s is fold_in(seed, s), the data iterator state is
saved with the model, and a restarted run re-enters the loop at the saved step, so it
computes bit-for-bit what an uninterrupted run would (on CPU).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import signal
import time
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from t2t.errors import CheckpointMismatchError, ConfigError, UserError
from t2t.models.base import Model
from t2t.train import flops as flops_lib
from t2t.train import param_views, partitioning
from t2t.train.checkpoints import Checkpointer
from t2t.train.metrics_log import MetricsLogger
from t2t.train.optimizers import accumulate_gradients

_log = logging.getLogger(__name__)


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How long, how often, where."""

    model_dir: str
    train_steps: int = 1000
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 3
    async_checkpoint: bool = True
    num_microbatches: int = 1
    eval_every: int = 0          # 0: no periodic evaluation
    eval_steps: int = 10
    peak_flops: Optional[float] = None  # per device; None: the datasheet value if known
    measure_peak: bool = False   # no datasheet value (CPU): a matmul measured once per host
    progress_bar: bool = True
    # Generator of the dropout masks (parameter init is always threefry). On CPU "rbg" and
    # "unsafe_rbg" were no faster (benchmarks/dropout_rng.py); TPU setups often pick them.
    dropout_rng_impl: str = "threefry2x32"

    # field -> the least value that makes sense (train_steps 0: build, restore, save; no step)
    _LEAST = {"train_steps": 0, "log_every": 1, "checkpoint_every": 1, "keep_checkpoints": 1,
              "num_microbatches": 1, "eval_every": 0, "eval_steps": 1}

    def __post_init__(self):
        for name, least in self._LEAST.items():
            value = getattr(self, name)
            if value < least:
                macro = " (TRAIN_STEPS)" if name == "train_steps" else ""
                raise ConfigError(f"TrainConfig.{name}{macro} must be at least {least}, "
                                  f"got {value}")


class NonFiniteLossError(UserError, RuntimeError):
    """The loss became NaN or inf; the last checkpoint (if any) predates it."""


class Trainer:
    """Builds the sharded state and the compiled steps for one model on one mesh."""

    def __init__(self, model: Model, tx: optax.GradientTransformation, mesh,
                 config: TrainConfig, schedule: Optional[Callable] = None,
                 rules=partitioning.DEFAULT_RULES):
        self.model, self.tx, self.mesh, self.config = model, tx, mesh, config
        self.schedule, self.rules = schedule, rules
        self.replicated = NamedSharding(mesh, P())
        self.state_shardings = None
        self._train_step = self._eval_step = None
        self._traced_init = None        # (batch shapes, partitioning.TracedInit)

    # ------------------------------------------------------------------ state
    def init_state(self, example_batch: Dict[str, np.ndarray], *,
                   abstract: Optional[TrainState] = None) -> TrainState:
        """Parameters and optimizer state, created directly in the shardings that
        :meth:`abstract_init` (the one place they are decided) gives them; `abstract`: its
        result for this batch, when the caller has it already."""
        shapes = _shapes(example_batch)
        if abstract is None:
            self.abstract_init(shapes)
        traced = self._traced_init
        if traced is None or traced[0] != shapes:     # abstract_init saw another batch
            traced = (shapes, self._trace_init(shapes))
        params = traced[1].run(jax.random.PRNGKey(self.config.seed))   # in its own context
        self._traced_init = None                        # its jaxpr is not needed again
        s = self.state_shardings
        with partitioning.sharding_context(self.mesh, self.rules):
            opt_state = jax.jit(self.tx.init, out_shardings=s.opt_state)(params)
            step = jax.jit(lambda: jnp.zeros((), jnp.int32), out_shardings=self.replicated)()
        return TrainState(step, params, opt_state)

    def _trace_init(self, shapes) -> partitioning.TracedInit:
        rng = jax.ShapeDtypeStruct((2,), jnp.uint32)       # a jax.random.PRNGKey
        return partitioning.trace_init(lambda r: self.model.init(r, _zeros(shapes)), rng,
                                       mesh=self.mesh, rules=self.rules)

    def abstract_init(self, example_batch: Dict[str, Any]) -> TrainState:
        """The state `init_state` creates, as ShapeDtypeStructs carrying their shardings;
        sets `state_shardings`. Nothing is allocated or run, so `example_batch` (arrays or
        ShapeDtypeStructs) and the mesh may be those of a topology this host lacks. The
        model's init is traced here once; `init_state` compiles that trace."""
        shapes = _shapes(example_batch)
        traced = self._trace_init(shapes)
        self._traced_init = (shapes, traced)
        params, param_shardings = traced.abstract, traced.shardings
        self.tx = param_views.bind_param_axes(self.tx, traced.axes)   # T5's Adafactor: its views
        opt_shardings = partitioning.opt_state_shardings(self.tx, params, param_shardings)
        opt_state = partitioning.with_shardings(jax.eval_shape(self.tx.init, params),
                                                opt_shardings)
        self.state_shardings = TrainState(self.replicated, param_shardings, opt_shardings)
        step = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.replicated)
        return TrainState(step, params, opt_state)

    def abstract_batch(self, example_batch: Dict[str, Any]) -> Dict[str, jax.ShapeDtypeStruct]:
        """`example_batch`'s shapes as a *global* batch of ShapeDtypeStructs, sharded as
        `global_batch` shards real batches (dimension 0 over data and fsdp)."""
        rows = next(iter(example_batch.values())).shape[0]
        sharding = self._batch_sharding(rows)
        return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=sharding)
                for k, v in example_batch.items()}

    def lower_train_step(self, abstract_state: TrainState, abstract_batch):
        """The train step lowered for `abstract_init`'s state and an `abstract_batch`:
        `.compile()` gives the executable for the mesh's devices, run or not."""
        if self._train_step is None:
            self._compile()
        with partitioning.sharding_context(self.mesh, self.rules):
            return self._train_step.lower(abstract_state, abstract_batch)

    def abstract_state(self, state: TrainState):
        return jax.tree_util.tree_map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state,
            self.state_shardings)

    # ------------------------------------------------------------------ steps
    def _compile(self):
        model, tx, cfg, schedule = self.model, self.tx, self.config, self.schedule
        base_rng = jax.random.key(cfg.seed + 1, impl=cfg.dropout_rng_impl)

        def train_step(state: TrainState, batch):
            rng = jax.random.fold_in(base_rng, state.step)
            grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)
            (loss, metrics), grads = accumulate_gradients(
                grad_fn, state.params, batch, rng, cfg.num_microbatches,
                weight_fn=model.loss_weight)
            metrics = _reduce_microbatch_metrics(metrics)
            metrics["loss"] = loss
            updates, opt_state = tx.update(grads, state.opt_state, state.params)
            params = optax.apply_updates(state.params, updates)
            metrics["grad_norm"] = _grad_norm(grads, loss)
            if schedule is not None:
                metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
            return TrainState(state.step + 1, params, opt_state), metrics

        def eval_step(params, batch):
            return model.loss_fn(params, batch, None)[1]

        s = self.state_shardings
        self._train_step = jax.jit(train_step, in_shardings=(s, None),
                                   out_shardings=(s, self.replicated), donate_argnums=(0,))
        self._eval_step = jax.jit(eval_step, in_shardings=(s.params, None),
                                  out_shardings=self.replicated)

    def train_step(self, state: TrainState, batch) -> tuple[TrainState, Dict[str, jax.Array]]:
        if self._train_step is None:
            self._compile()
        with partitioning.sharding_context(self.mesh, self.rules):
            return self._train_step(state, self.global_batch(batch))

    def eval_step(self, params, batch) -> Dict[str, jax.Array]:
        if self._eval_step is None:
            self._compile()
        with partitioning.sharding_context(self.mesh, self.rules):
            return self._eval_step(params, self.global_batch(batch))

    def global_batch(self, batch: Dict[str, np.ndarray]):
        """Process-local numpy rows -> global arrays sharded over (data, fsdp)."""
        rows = next(iter(batch.values())).shape[0] * jax.process_count()
        return partitioning.to_global_arrays(batch, self.mesh, self._batch_sharding(rows).spec)

    def _batch_sharding(self, global_rows: int) -> NamedSharding:
        """The batch sharding, after checking that it divides `global_rows`."""
        sharding = partitioning.batch_sharding(self.mesh, self.rules)
        ways = int(np.prod([self.mesh.shape[a] for a in _axes(sharding.spec[0])]))
        if global_rows % ways:
            raise ValueError(f"global batch size {global_rows} is not divisible by the {ways} "
                             f"ways the mesh splits the batch ({sharding.spec[0]}); change "
                             "BATCH_SIZE or MeshConfig")
        return sharding

    def evaluate(self, params, batches: Iterator[Dict[str, np.ndarray]], steps: int):
        """Mean of eval metrics over up to `steps` batches (num_tokens summed). Each batch's
        metrics are fetched after the next batch is dispatched, so reading the next batch
        overlaps the device's work on this one."""
        totals: Dict[str, float] = {}

        def add(metrics) -> None:
            for k, v in jax.device_get(metrics).items():
                totals[k] = totals.get(k, 0.0) + float(v)

        n, pending = 0, None
        for batch in batches:
            if n == steps:
                break
            dispatched = self.eval_step(params, batch)
            if pending is not None:
                add(pending)
            pending, n = dispatched, n + 1
        if pending is not None:
            add(pending)
        return {k: (v if k == "num_tokens" else v / max(n, 1)) for k, v in totals.items()}


def _axes(entry) -> tuple:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _shapes(batch) -> Dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}


def _zeros(shapes):
    return {k: jnp.zeros(s.shape, s.dtype) for k, s in shapes.items()}


SMALL_GRADIENT = 65536    # elements; smaller gradients are joined before the grad norm


def _grad_norm(grads, loss):
    """Global L2 norm of the gradients; NaN when the loss is not finite.

    Computed inside a conditional so that XLA keeps it out of the optimizer's fused loops:
    fused there, XLA:CPU wrote every gradient's square to memory before summing it (AdamW
    plus the norm over T5.1.1-base's parameters: benchmarks/README.md has the timings).
    The small gradients (biases, norm scales) are joined into one vector first: summed one
    by one, XLA:CPU turned each sum into its own slow reduce-window (131 in a GPT-2 small
    step).
    """
    def norm():
        leaves = [g.astype(jnp.float32) for g in jax.tree.leaves(grads)]
        squares = [jnp.sum(jnp.square(g)) for g in leaves if g.size >= SMALL_GRADIENT]
        small = [g.ravel() for g in leaves if g.size < SMALL_GRADIENT]
        if small:
            squares.append(jnp.sum(jnp.square(jnp.concatenate(small))))
        return jnp.sqrt(sum(squares, jnp.zeros((), jnp.float32)))

    return jax.lax.cond(jnp.isfinite(loss), norm, lambda: jnp.full((), jnp.nan, jnp.float32))


def _reduce_microbatch_metrics(metrics):
    """aux comes back [num_microbatches, ...]: sum counts, average the rest."""
    return {k: (jnp.sum(v) if k == "num_tokens" else jnp.mean(v)) for k, v in metrics.items()}


def batch_geometry(family: str, batch: Dict[str, np.ndarray]) -> Dict[str, int]:
    """Lengths that the FLOP formula needs, read off a (process-local) batch."""
    geometry = {}
    if "encoder_input_tokens" in batch:
        geometry["input_length"] = batch["encoder_input_tokens"].shape[1]
    if "decoder_input_tokens" in batch:
        geometry["target_length"] = batch["decoder_input_tokens"].shape[1]
    if "token_ids" in batch:      # ELMo's biLM reads and predicts every token
        geometry["target_length"] = batch["token_ids"].shape[1]
    if "masked_positions" in batch:
        geometry["num_masked"] = batch["masked_positions"].shape[1]
    elif flops_lib.formula(family).masked_logits:
        geometry["num_masked"] = 0   # a fine-tuning head: no vocabulary logits at all
    return geometry


class _Preemption:
    """Turns SIGTERM (a preempted TPU VM) and a first Ctrl-C (SIGINT) into a flag the loop
    checks after each step: it then saves and stops. A second Ctrl-C aborts at once.

    A signal that was ignored when the run started stays ignored: a job started under
    `nohup` or by a batch system that ignores SIGINT is not made interruptible by Ctrl-C."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = None          # the name of the signal that asked to stop
        self._previous = {}

    def __enter__(self):
        for signum in self.SIGNALS:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame):
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        if signum == signal.SIGINT:
            _log.warning("\nCtrl-C: saving a checkpoint after this step, then stopping "
                         "(Ctrl-C again aborts without saving)")

    def __exit__(self, *exc):
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


@dataclasses.dataclass
class TrainResult:
    step: int
    state: TrainState
    history: list            # logged metric dicts
    stopped_by: str          # "done" | "preempted"
    flops_per_step: float = 0.0   # model FLOPs of one global step (t2t.train.flops)
    tokens_per_step: int = 0      # tokens of one global step, padding included
    geometry: Optional[Dict[str, int]] = None  # the row lengths the FLOPs were counted for


def step_cost(model, example: Dict[str, np.ndarray]) -> Tuple[Dict[str, int], float, int]:
    """(row geometry, model FLOPs, tokens with padding) of one global training step whose
    process-local rows are `example`."""
    geometry = batch_geometry(model.family, example)
    global_rows = example[next(iter(example))].shape[0] * jax.process_count()
    flops = flops_lib.step_flops(model.config, model.family, global_rows, **geometry)
    return geometry, flops, global_rows * sum(v for k, v in geometry.items()
                                              if k != "num_masked")


def restore(ckpt: Checkpointer, step: int, trainer: Trainer,
            state: TrainState) -> Tuple[TrainState, Optional[dict]]:
    """`step`'s (state, data state) onto `state`'s shardings. A checkpoint of T5's Adafactor
    from before per-parameter views (`t2t.train.param_views`) has its optimizer state
    carried over exactly; any other mismatch is the checkpoint's one-line error."""
    target = trainer.abstract_state(state)
    try:
        return ckpt.restore(step, target)
    except CheckpointMismatchError as mismatch:
        stored_tx = param_views.stored_shapes_tx(trainer.tx)
        if stored_tx is None:
            raise
        shardings = trainer.state_shardings
        stored_opt = partitioning.with_shardings(
            jax.eval_shape(stored_tx.init, target.params),
            partitioning.opt_state_shardings(stored_tx, target.params, shardings.params))
        try:
            old, data_state = ckpt.restore(step, target.replace(opt_state=stored_opt))
            carry = jax.jit(lambda o, p: param_views.from_stored_shapes(trainer.tx, o, p),
                            out_shardings=shardings.opt_state)
            opt_state = carry(old.opt_state, old.params)
        except ValueError:       # CheckpointMismatchError too: not that Adafactor state
            raise mismatch from None
    _log.info("carried the checkpoint's Adafactor statistics over to T5's per-parameter views")
    return old.replace(opt_state=opt_state), data_state


def _reason(error: BaseException) -> str:
    """An exception as one short line: `TYPE: first line` (at most 200 characters) of the
    error it was raised from, if any (orbax wraps tensorstore's own message)."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def restore_newest_readable(ckpt: Checkpointer, trainer: Trainer, state: TrainState
                            ) -> Tuple[Optional[int], TrainState, Optional[dict]]:
    """(step, state, data state) of the newest checkpoint that can be read; (None, `state`,
    None) when there is none at all.

    A newer step whose files cannot be read (truncated, corrupt: orbax's FAILED_PRECONDITION,
    a JSON error, ...) is logged in one line and set aside, not deleted: its directory is
    renamed `N.unreadable` (`Checkpointer.set_aside`), so its files stay on disk for a look,
    the retention of `keep_checkpoints` never counts or deletes it, and the resumed run saves
    step N again beside it. When no step can be read nothing is renamed and the error is a
    UserError saying so. A checkpoint that reads but does not fit the model
    (CheckpointMismatchError) is not damage: it is raised as it is."""
    unreadable = []
    for step in reversed(ckpt.all_steps()):
        try:
            restored, data_state = restore(ckpt, step, trainer, state)
        except (UserError, MemoryError):
            raise
        except Exception as e:  # noqa: BLE001  whatever a damaged file makes orbax raise
            _log.debug("checkpoint %d cannot be read", step, exc_info=True)
            unreadable.append((step, _reason(e)))
            continue
        for bad, reason in unreadable:
            where = ckpt.set_aside(bad)
            _log.warning("checkpoint %d cannot be read (%s): resuming from the newest readable "
                         "one, step %d; the damaged files are kept in %s", bad, reason, step,
                         where)
        return step, restored, data_state
    if unreadable:
        steps = ", ".join(str(bad) for bad, _ in unreadable)
        raise UserError(f"no checkpoint in {ckpt.directory} can be read (steps {steps}; step "
                        f"{unreadable[0][0]}: {unreadable[0][1]}): copy intact ones back from a "
                        "backup, or move the checkpoints directory aside to start from step 0",
                        "\n".join(f"step {bad}: {reason}" for bad, reason in unreadable))
    return None, state, None


def fit(trainer: Trainer, train_data, *, eval_data_fn: Optional[Callable[[], Iterator]] = None,
        config_str: str = "") -> TrainResult:
    """Train to `config.train_steps`, resuming from the model dir's latest checkpoint.

    `train_data` is a resumable iterator (get_state/set_state) of process-local numpy
    batches; `eval_data_fn()` returns a fresh eval iterator.
    """
    cfg = trainer.config
    _log.info("reading the first batch")
    data_state0 = train_data.get_state()
    example = next(train_data)
    train_data.set_state(data_state0)
    ckpt = Checkpointer(f"{cfg.model_dir}/checkpoints", keep=cfg.keep_checkpoints,
                        async_save=cfg.async_checkpoint)
    # A checkpoint restores into the abstract state (shapes and shardings alone): a resumed
    # run never builds, compiles or allocates the initial parameters it would overwrite.
    abstract = trainer.abstract_init(example)
    start, state, data_state = restore_newest_readable(ckpt, trainer, abstract)
    if start is None:
        _log.info("initialising the parameters and optimizer state")
        state = trainer.init_state(example, abstract=abstract)
    else:
        if data_state is not None:
            train_data.set_state(data_state)
        if start >= cfg.train_steps:
            _log.info("already done: %s is at step %d of TRAIN_STEPS = %d (raise "
                      "--gin.TRAIN_STEPS to train longer)", cfg.model_dir, start, cfg.train_steps)
        else:
            _log.info("resumed from step %d (%s)", start, cfg.model_dir)
    start = start or 0

    geometry, step_flops, tokens_per_step = step_cost(trainer.model, example)
    peak = cfg.peak_flops or flops_lib.peak_flops_per_device()
    if peak is None and cfg.measure_peak and start < cfg.train_steps:
        peak, source = flops_lib.host_peak_flops(trainer.model.config.dtype)
        _log.info("matmul peak %.1f GFLOP/s per device (%s)", peak / 1e9, source)
    peak_total = None if peak is None else peak * jax.device_count()

    if start < cfg.train_steps:
        _log.info("compiling the train step (cached for later runs), then training to step %d",
                  cfg.train_steps)
    logger = MetricsLogger(cfg.model_dir, total_steps=cfg.train_steps, every_n=cfg.log_every,
                           initial_step=start, progress_bar=cfg.progress_bar)
    history = []
    stopped_by = "done"
    pending = None                     # (step, loss) checked one step late: no sync stall
    interval_start, interval_steps = time.perf_counter(), 0
    with _Preemption() as preemption, logger:
        step = start
        while step < cfg.train_steps:
            batch = next(train_data)
            state, metrics = trainer.train_step(state, batch)
            step += 1
            interval_steps += 1
            if pending is not None:
                _check_finite(*pending)
            pending = (step, metrics["loss"])

            if logger.should_log(step) or step in (start + 1, cfg.train_steps):
                values = {k: float(v) for k, v in jax.device_get(metrics).items()}
                _check_finite(step, values["loss"])
                elapsed = time.perf_counter() - interval_start
                step_time = elapsed / interval_steps
                values.update(step_time=step_time, tokens_per_s=tokens_per_step / step_time,
                              perplexity=math.exp(min(values["loss"], 50.0)))
                if peak_total:
                    values["mfu"] = flops_lib.mfu(step_flops, step_time, peak_total)
                logger.log(step, values, force=True)
                history.append({"step": step, **values})
                interval_start, interval_steps = time.perf_counter(), 0

            if cfg.eval_every and eval_data_fn is not None and step % cfg.eval_every == 0:
                ev = trainer.evaluate(state.params, eval_data_fn(), cfg.eval_steps)
                logger.log(step, {f"eval/{k}": v for k, v in ev.items()}, force=True)
                history.append({"step": step, **{f"eval/{k}": v for k, v in ev.items()}})

            checkpoint_now = step % cfg.checkpoint_every == 0 or step == cfg.train_steps
            if checkpoint_now or preemption.requested:
                _check_finite(step, metrics["loss"])
                ckpt.save(step, state, data_state=train_data.get_state(), config_str=config_str,
                          force=True)
            if preemption.requested:
                stopped_by = "preempted"
                _log.warning("%s: saved step %d; run the same command to resume",
                             preemption.requested, step)
                break
    ckpt.wait()
    ckpt.close()
    return TrainResult(step, state, history, stopped_by, step_flops, tokens_per_step, geometry)


def _check_finite(step: int, loss) -> None:
    value = float(loss)
    if not math.isfinite(value):
        raise NonFiniteLossError(
            f"loss is {value} at step {step}; stopping (the last checkpoint predates it): lower "
            "the learning rate (make_schedule.peak) or lengthen its warm-up, or train in "
            "float32 (--gin.TransformerConfig.dtype='float32') if the run is in float16")
