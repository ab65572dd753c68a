"""Checkpoints: a thin layer over ``orbax.checkpoint.CheckpointManager``.

One step directory holds three items: ``state`` (the train-state pytree, any sharding),
``data_state`` (each process's input-pipeline iterator state, one JSON file per process,
``process_{i}-of-{n}.json``, written by grain's checkpoint handler: on a pod every host reads
its own shards, so every host resumes from its own position) and ``config`` (the resolved gin
config string, JSON). Steps written before the per-process files hold process 0's state
alone under ``data``; they are still read. The directory may be local or in a bucket
(gs://). Saves are asynchronous; the manager keeps the newest ``keep`` steps. Restore takes
an abstract target (``jax.ShapeDtypeStruct`` leaves *with shardings*), so a checkpoint
written on one mesh restores onto any other; stored shapes and dtypes are checked against
the target first, with an error naming every mismatching parameter.

``restore_params`` reads the parameters alone of one step (no optimizer or data state),
as numpy or onto a sharded target: a fine-tuning's initial checkpoint, a run to evaluate
or convert. ``latest_step`` and ``checkpoint_dir`` find the step and the directory.

A step directory that cannot be read (truncated or corrupt files) is never deleted:
``set_aside`` renames it ``N.unreadable`` (a name orbax does not take for a step), so that
training resumes from an older step and saves step N again beside the damaged copy. A save
that fails for want of space (ENOSPC, also as tensorstore's message through orbax) is a
DiskFullError naming the directory, the step not saved and the newest intact step.
"""
from __future__ import annotations

import errno
import functools
import json
import os
from typing import Any, Optional

import jax
import grain
import numpy as np
import orbax.checkpoint as ocp
# orbax's own registry and metadata store (pinned orbax: private modules, no public handle)
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization import type_handler_registry

from t2t import storage
from t2t.errors import CheckpointMismatchError, DiskFullError

PyTree = Any
STATE, DATA_STATE, CONFIG = "state", "data_state", "config"
LEGACY_DATA = "data"      # process 0's data state alone (orbax's JSON item), before data_state
UNREADABLE = ".unreadable"   # suffix of a step directory set aside as unreadable


def _path(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def abstract_state(tree: PyTree, shardings: PyTree) -> PyTree:
    """``ShapeDtypeStruct`` leaves with ``shardings`` (same structure), a restore target."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s),
                        tree, shardings)


def _as_abstract(target: PyTree) -> PyTree:
    def one(path, x):
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if not isinstance(x, jax.ShapeDtypeStruct) or x.sharding is None:
            raise ValueError(f"restore target {_path(path)!r} must be a "
                             f"jax.ShapeDtypeStruct with a sharding (or a jax.Array), got "
                             f"{x!r}")
        return x
    return jax.tree_util.tree_map_with_path(one, target)


def _hint(path: str, stored: tuple, wanted: tuple) -> str:
    if len(stored) != len(wanted):
        return " — different rank (scanned vs unrolled layers?)"
    differ = [i for i, (s, w) in enumerate(zip(stored, wanted)) if s != w]
    name = path.lower()
    if len(stored) == 2 and "embed" in name:        # [vocab, d_model]
        return " — vocab size differs?" if differ == [0] else " — d_model differs?"
    if len(stored) == 2 and "logits" in name:       # [d_model, vocab]
        return " — vocab size differs?" if differ == [1] else " — d_model differs?"
    return ""


def check_compatible(stored: PyTree, target: PyTree, *, check_dtypes: bool = True,
                     where: str = "checkpoint") -> None:
    """Raises CheckpointMismatchError if any path's shape/dtype differs or only one side has
    it: a one-line summary (how many differ, the first few, "different family" when the trees
    share no parameter) plus every problem in its details. ``stored`` is orbax metadata
    (leaves with .shape/.dtype), ``target`` abstract; ``where`` names the checkpoint."""
    def flat(tree):
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        return {_path(p): x for p, x in leaves}

    have, want = flat(stored), flat(target)
    problems = []
    for path in sorted(set(have) | set(want)):
        if path not in want:
            problems.append(f"{path}: in the checkpoint {tuple(have[path].shape)} but not in "
                            f"the model")
            continue
        if path not in have:
            problems.append(f"{path}: in the model {tuple(want[path].shape)} but not in the "
                            f"checkpoint")
            continue
        s_shape, w_shape = tuple(have[path].shape), tuple(want[path].shape)
        if s_shape != w_shape:
            problems.append(f"{path}: checkpoint {s_shape} vs model {w_shape}"
                            f"{_hint(path, s_shape, w_shape)}")
        elif check_dtypes and np.dtype(have[path].dtype) != np.dtype(want[path].dtype):
            problems.append(f"{path}: checkpoint dtype {np.dtype(have[path].dtype)} vs model "
                            f"{np.dtype(want[path].dtype)}")
    if problems:
        raise CheckpointMismatchError(_mismatch_summary(where, problems, have, want),
                                      "checkpoint does not match the model:\n  "
                                      + "\n  ".join(problems))


def _mismatch_summary(where: str, problems: list, have: dict, want: dict) -> str:
    """One line: how many parameters differ, the first three, and the likely cause. In a
    train state only the model parameters (``params/...``) count: optimizer slots follow
    them."""
    def model_params(paths):
        params = {p for p in paths if p.startswith("params/")}
        return params or set(paths)

    have_p, want_p = model_params(have), model_params(want)
    shown = [p for p in problems if p.split(":")[0] in have_p | want_p]
    if not shown and have_p == want_p:          # the model fits; the optimizer does not
        first = "; ".join(p.split(" — ")[0] for p in problems[:2])
        return (f"{where}: the model's parameters fit, its optimizer state does not "
                f"({len(problems)} entries differ; first: {first}): it was written with "
                "another optimizer. Resume with the optimizer it was written with, or start a "
                "new MODEL_DIR from its parameters (t2t finetune --gin.INITIAL_CHECKPOINT=...)")
    shown = shown or problems
    first = "; ".join(p.split(" — ")[0] for p in shown[:3])
    cause = ("different family or model: the checkpoint and the model share no parameter "
             "name" if not have_p & want_p else "different model size or config?")
    return (f"{where} does not fit the model: {len(shown)} of {len(have_p | want_p)} "
            f"parameters differ ({cause}); first: {first}. Check --gin_file and the model "
            "bindings, or start in a new MODEL_DIR")


def _move(source, target) -> None:
    """Renames the directory `source` to `target` (epath.Paths). An object store has no
    rename: there every file is copied, then the originals deleted (gcsfs's own rename first
    tries a move API that flat buckets refuse, slowly)."""
    if not storage.is_remote(str(source)):
        source.rename(target)
        return
    for child in sorted(source.iterdir()):   # (epath refuses rglob on GCS)
        if child.is_dir():
            _move(child, target / child.name)
        else:
            target.mkdir(parents=True, exist_ok=True)
            child.copy(target / child.name)
    source.rmtree()


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, says the disk is full: an OSError
    with errno ENOSPC, or a message (tensorstore's, through orbax) saying "No space left on
    device" or RESOURCE_EXHAUSTED about anything but memory."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        text = str(error)
        if "No space left on device" in text or (
                "RESOURCE_EXHAUSTED" in text and "memory" not in text.lower()):
            return True
        error = error.__cause__ or error.__context__
    return False


@functools.cache
def _write_whole_shards_in_one_process() -> None:
    """In a single process, each replicated shard is written whole from one replica.

    orbax's default on CPU and TPU ("replica-parallel") splits a replicated shard among its
    replicas so that several hosts share the writing; in one process that only adds an
    eager slice per shard and device (the first save of a test-size BERT on 8 CPU devices:
    1.7 s, against 0.4 s written whole). Several processes keep orbax's default. The files
    restore either way."""
    if jax.process_count() == 1:
        type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(
            jax.Array, ocp.type_handlers.ArrayHandler(
                use_replica_parallel=False, array_metadata_store=array_metadata_store.Store()),
            override=True, ignore_warnings=True)


class DataState:
    """One process's data-iterator state (a JSON-able dict) in the form grain's checkpoint
    handler saves and restores: ``get_state`` gives JSON bytes, ``set_state`` takes them."""

    def __init__(self, state: Optional[dict] = None):
        self.state = state

    def get_state(self) -> bytes:
        return json.dumps(self.state).encode()

    def set_state(self, raw: bytes) -> None:
        self.state = json.loads(raw)

    def start_prefetch(self) -> None:   # the handler starts a real iterator's prefetch
        pass


class Checkpointer:
    """Async, keep-N checkpoints of (train state, data-iterator state, config string)."""

    def __init__(self, directory: str, keep: Optional[int] = 3, async_save: bool = True,
                 save_interval_steps: int = 1, keep_period: Optional[int] = None):
        self.directory = str(storage.path(directory))   # local (absolute) or gs://...
        _write_whole_shards_in_one_process()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, save_interval_steps=save_interval_steps, keep_period=keep_period,
            enable_async_checkpointing=async_save, create=True)
        # Handlers registered up front, so a fresh manager can read an old step's metadata.
        handlers = {STATE: ocp.StandardCheckpointHandler(),
                    DATA_STATE: grain.checkpoint.CheckpointHandler(),
                    LEGACY_DATA: ocp.JsonCheckpointHandler(), CONFIG: ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, options=options,
                                              item_handlers=handlers)
        self._pending: Optional[int] = None   # the step of the save under way, if any

    def save(self, step: int, state: PyTree, data_state: Optional[dict] = None,
             config_str: Optional[str] = None, force: bool = False) -> bool:
        """Starts saving ``step`` (returns at once when async); False if the interval or an
        existing checkpoint of this step says skip. ``force`` ignores the interval."""
        items = {STATE: ocp.args.StandardSave(state)}
        if data_state is not None:       # this process's, as it is now (the save may be async)
            items[DATA_STATE] = grain.checkpoint.CheckpointSave(DataState(data_state))
        if config_str is not None:
            items[CONFIG] = ocp.args.JsonSave({"gin": config_str})
        self.wait()                       # the pending save's own error names its own step
        self._pending = int(step)
        try:
            saved = self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)
        except Exception as e:
            self._raise_if_disk_full(e)
            raise
        if not saved:
            self._pending = None
        return saved

    def _raise_if_disk_full(self, error: BaseException) -> None:
        """A DiskFullError (one line: the directory, the step not saved, the newest intact
        step) from `error` if it says the disk is full; nothing otherwise."""
        step, self._pending = self._pending, None
        if not is_disk_full(error):
            return
        try:
            self._manager.reload()        # the steps whose directories are whole on disk
            intact = [s for s in self._manager.all_steps() if s != step]
        except Exception:  # noqa: BLE001  as little as possible after a failed write
            intact = []
        newest = (f"the newest intact checkpoint is step {max(intact)}" if intact else
                  "no checkpoint is intact yet")
        raise DiskFullError(f"no space left on the device of {self.directory}: step {step} "
                            f"was not saved and {newest}; free space (or keep fewer "
                            "checkpoints), then run the same command to resume",
                            str(error)) from error

    def latest_step(self) -> Optional[int]:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def _step(self, step: Optional[int]) -> int:
        step = self.latest_step() if step is None else int(step)
        if step is None or step not in self._manager.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                                    f"have {self.all_steps()}")
        return step

    def restore(self, step: Optional[int], abstract_state: PyTree, *,
                allow_dtype_cast: bool = False) -> tuple[PyTree, Optional[dict]]:
        """Restores (state, data_state) of ``step`` (None = latest) onto the shardings of
        ``abstract_state`` (ShapeDtypeStruct leaves with ``sharding=``, or arrays)."""
        self.wait()                          # a pending save of this step must land first
        step = self._step(step)
        target = _as_abstract(abstract_state)
        metadata = self._manager.item_metadata(step)
        stored = metadata[STATE]
        check_compatible(getattr(stored, "tree", stored), target,
                         check_dtypes=not allow_dtype_cast,
                         where=f"checkpoint {self.directory} (step {step})")
        items = {STATE: ocp.args.StandardRestore(target)}
        stored_items = metadata.keys()      # the JSON items' metadata itself is None
        if DATA_STATE in stored_items:
            self._check_data_processes(step)
            items[DATA_STATE] = grain.checkpoint.CheckpointRestore(DataState())
        elif LEGACY_DATA in stored_items:
            items[LEGACY_DATA] = ocp.args.JsonRestore()
        if CONFIG in stored_items:          # read too: a step is whole only if all of it reads
            items[CONFIG] = ocp.args.JsonRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        if DATA_STATE in items:
            return restored[STATE], restored[DATA_STATE].state
        return restored[STATE], restored.get(LEGACY_DATA)

    def _check_data_processes(self, step: int) -> None:
        """A CheckpointMismatchError (one line) if ``step``'s data states were written by
        another number of processes than this run has: each host's position in its own
        shards cannot be carried to a different split of the corpus."""
        folder = storage.path(self.directory) / str(step) / DATA_STATE
        names = [p.name for p in folder.iterdir()] if folder.exists() else []
        written = {name.rsplit("-of-", 1)[1].removesuffix(".json") for name in names
                   if name.startswith("process_") and "-of-" in name}
        if written and written != {str(jax.process_count())}:
            raise CheckpointMismatchError(
                f"checkpoint {self.directory} (step {step}) was written by "
                f"{'/'.join(sorted(written))} process(es), this run has {jax.process_count()}: "
                "each process resumes its own position in the data, so resume with the same "
                "number of processes")

    def set_aside(self, step: int) -> str:
        """Renames ``step``'s directory ``N.unreadable`` (``N.unreadable.1``, ... if taken),
        keeping every file, and forgets the step: the path it now has. Process 0 renames;
        every process waits for it."""
        self.wait()
        root = storage.path(self.directory)
        target = root / f"{int(step)}{UNREADABLE}"
        n = 0
        while target.exists():
            n += 1
            target = root / f"{int(step)}{UNREADABLE}.{n}"
        if jax.process_index() == 0:
            _move(root / str(int(step)), target)
        if jax.process_count() > 1:
            ocp.multihost.sync_global_processes(f"t2t_set_aside_{int(step)}")
        self._manager.reload()
        return str(target)

    def config_str(self, step: Optional[int] = None) -> Optional[str]:
        """The config string saved with ``step`` (None = latest), if any."""
        step = self._step(step)
        if CONFIG not in self._manager.item_metadata(step).keys():
            return None
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))
        return restored[CONFIG]["gin"]

    def wait(self) -> None:
        """Blocks until the pending async save has been committed; a DiskFullError if it
        failed for want of space."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            self._raise_if_disk_full(e)
            raise
        self._pending = None

    def close(self) -> None:
        self.wait()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()



# ----------------------------------------------------------------------------- parameters
def checkpoint_dir(path: str) -> str:
    """`path/checkpoints` for a t2t MODEL_DIR, else `path` itself (local or gs://)."""
    sub = os.path.join(path, "checkpoints")
    return sub if storage.path(sub).is_dir() else path


def is_step_dir(path: str) -> bool:
    """Whether `path` is one step of a t2t checkpoints directory (`.../checkpoints/<step>`)."""
    where = storage.path(path)
    return where.name.isdigit() and (where / STATE).is_dir()


def latest_step(ckpt_dir: str) -> Optional[int]:
    """The newest complete step in a checkpoints directory (None: none, or no directory)."""
    if not storage.path(ckpt_dir).is_dir():
        return None
    with Checkpointer(ckpt_dir, async_save=False) as ckpt:
        return ckpt.latest_step()


def restore_params(path: str, target: Optional[PyTree] = None, step: Optional[int] = None,
                   what: str = "initial checkpoint") -> PyTree:
    """The parameters of a t2t checkpoint's `step` (default: the latest, or the step `path`
    names when it is `MODEL_DIR/checkpoints/<step>`), without optimizer or data state.
    `path`: a MODEL_DIR, its `checkpoints/`, or one step of it. `target`: abstract params
    with shardings (shapes and dtypes are checked, every mismatch named, `what` names the
    checkpoint); None restores the stored tree as numpy arrays."""
    ckpt_dir = checkpoint_dir(path)
    if step is None and is_step_dir(path):      # MODEL_DIR/checkpoints/<step>: that step
        ckpt_dir, step = str(storage.path(path).parent), int(storage.path(path).name)
    step = latest_step(ckpt_dir) if step is None else step
    if step is None:
        raise FileNotFoundError(f"no t2t checkpoint in {path!r} (expected a MODEL_DIR with "
                                "checkpoints/<step>/ or a Hugging Face directory)")
    state_dir = storage.path(ckpt_dir) / str(step) / STATE
    stored = ocp.StandardCheckpointer().metadata(state_dir)
    stored = getattr(stored, "item_metadata", stored)
    stored = getattr(stored, "tree", stored)["params"]
    if target is None:
        target = jax.tree.map(lambda m: np.zeros((), m.dtype), stored)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target)
    else:
        check_compatible(stored, target, where=f"{what} {path} (step {step})")
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)
    restored = ocp.PyTreeCheckpointer().restore(state_dir, args=ocp.args.PyTreeRestore(
        item={"params": target}, restore_args={"params": restore_args}, partial_restore=True))
    return restored["params"]
