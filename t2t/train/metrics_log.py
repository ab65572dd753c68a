"""Training metrics to a progress bar, a JSONL file and TensorBoard event files.

Only process 0 writes. Steps that are not logged cost nothing: the metrics dict is not
touched, so device arrays in it are never fetched (no host sync). The model dir may be a
bucket (gs://): see `t2t.storage`.
"""
from __future__ import annotations

import json
import math
import numbers
import os
import struct
import sys
import time
from typing import Any, Mapping, Optional

import jax
import numpy as np
import tqdm

from t2t import storage

# Progress-bar labels; a metric matches on the last part of its name ("train/loss" → loss).
_POSTFIX = {"loss": "loss", "learning_rate": "lr", "lr": "lr",
            "tokens_per_second": "tok/s", "tokens_per_sec": "tok/s", "tok/s": "tok/s",
            "mfu": "mfu"}


# tensorboardX's optional hooks, none of which t2t uses (scalars only; bucket event files go
# through its own writer below): importing torch alone adds over a second to every run's start.
_TENSORBOARDX_OPTIONAL = ("torch", "boto3", "google.cloud.storage")


def _tensorboardx():
    """The tensorboardX module, imported with its optional hooks hidden (those not yet
    imported read as absent during the import, and are importable again after it)."""
    hidden = [name for name in _TENSORBOARDX_OPTIONAL if name not in sys.modules]
    sys.modules.update(dict.fromkeys(hidden))           # None: `import name` raises ImportError
    try:
        import tensorboardX
        import tensorboardX.record_writer
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]
    return tensorboardX


def _to_python(value: Any) -> Any:
    """Device/numpy values → JSON-friendly Python (scalars → int/float, arrays → lists)."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    arr = np.asarray(jax.device_get(value))
    if arr.ndim == 0:
        return arr.item()
    return arr.tolist()


def _format(label: str, value: float) -> str:
    if label == "lr":
        return f"{value:.2e}"
    if label == "tok/s":
        return f"{value:,.0f}"
    return f"{value:.4g}"


class MetricsLogger:
    """Writes metrics every ``every_n`` steps (and at ``total_steps``).

    * ``<model_dir>/metrics.jsonl`` — one object per logged step, ``{"step": s, ...}``,
      appended (a resumed run continues the file, dropping the rows of the steps after
      ``initial_step`` that it replays);
    * ``<model_dir>/tensorboard/`` — scalar summaries (tensorboardX, no TensorFlow);
    * a tqdm bar with loss / lr / tok/s in its postfix.
    """

    def __init__(self, model_dir: str, total_steps: Optional[int] = None, every_n: int = 100,
                 *, initial_step: int = 0, progress_bar: bool = True,
                 tensorboard: bool = True, jsonl_name: str = "metrics.jsonl",
                 tensorboard_subdir: str = "tensorboard"):
        if every_n < 1:
            raise ValueError(f"every_n must be >= 1, got {every_n}")
        self.model_dir = model_dir
        self.total_steps = total_steps
        self.every_n = every_n
        self.enabled = jax.process_index() == 0
        self.jsonl_path = os.path.join(model_dir, jsonl_name)
        self.tensorboard_dir = os.path.join(model_dir, tensorboard_subdir)
        self._jsonl = self._writer = self._bar = None
        if not self.enabled:
            return
        storage.path(model_dir).mkdir(parents=True, exist_ok=True)
        _drop_rows_after(self.jsonl_path, initial_step)
        self._jsonl = (_WholeObjectFile(self.jsonl_path) if storage.is_remote(model_dir)
                       else open(self.jsonl_path, "a", encoding="utf-8"))
        if tensorboard:
            tensorboardX = _tensorboardx()  # imported lazily: only process 0 needs it
            if storage.is_remote(model_dir):
                tensorboardX.record_writer.register_writer_factory(
                    model_dir.split(":", 1)[0], _BucketEventFiles())
            self._writer = tensorboardX.SummaryWriter(self.tensorboard_dir, flush_secs=30)
        if progress_bar:
            # Redraw at most every 5 s when stderr is a log file rather than a terminal.
            interactive = getattr(sys.stderr, "isatty", lambda: False)()
            self._bar = tqdm.tqdm(total=total_steps, initial=initial_step, unit="step",
                                  dynamic_ncols=True, mininterval=0.1 if interactive else 5.0)
        self._bar_step = initial_step

    def should_log(self, step: int) -> bool:
        """True on steps that :meth:`log` writes (every_n-th and the last)."""
        return step % self.every_n == 0 or (self.total_steps is not None
                                            and step == self.total_steps)

    def log(self, step: int, metrics: Mapping[str, Any], *, force: bool = False) -> bool:
        """Advances the bar to ``step``; writes ``metrics`` if due (or ``force``)."""
        if not self.enabled:
            return False
        if self._bar is not None and step > self._bar_step:
            self._bar.update(step - self._bar_step)
            self._bar_step = step
        if not (force or self.should_log(step)):
            return False
        values = {k: _to_python(v) for k, v in metrics.items()}
        self._jsonl.write(json.dumps({"step": int(step), **values}) + "\n")
        self._jsonl.flush()
        scalars = {k: float(v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._writer is not None:
            for k, v in scalars.items():
                self._writer.add_scalar(k, v, global_step=int(step))
        if self._bar is not None:
            postfix = {}
            for k, v in scalars.items():
                label = _POSTFIX.get(k.rsplit("/", 1)[-1])
                if label and math.isfinite(v):
                    postfix[label] = _format(label, v)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
        return True

    def flush(self) -> None:
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flushes and closes every sink; safe to call twice."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _WholeObjectFile:
    """A file in a bucket, where objects cannot be appended to: what is written is kept and
    the whole object rewritten on `flush`, at most every `min_interval` seconds (the first
    and the last time at once)."""

    def __init__(self, path: str, binary: bool = False, min_interval: float = 30.0):
        self.path, self.binary, self.min_interval = storage.path(path), binary, min_interval
        self._chunks: list = []
        if self.path.exists():
            self._chunks.append(self.path.read_bytes() if binary
                                else self.path.read_text(encoding="utf-8"))
        self._dirty, self._last = False, -math.inf

    def write(self, data) -> None:
        self._chunks.append(data)
        self._dirty = True

    def flush(self, force: bool = False) -> None:
        if self._dirty and (force or time.monotonic() - self._last >= self.min_interval):
            if self.binary:
                self.path.write_bytes(b"".join(self._chunks))
            else:
                self.path.write_text("".join(self._chunks), encoding="utf-8")
            self._dirty, self._last = False, time.monotonic()

    def close(self) -> None:
        self.flush(force=True)


class _BucketEventFiles:
    """tensorboardX writer factory for event files in a bucket, through epath (its own gs://
    writer re-uploads from `__del__`, which can stall interpreter exit for minutes)."""

    def open(self, path: str) -> _WholeObjectFile:
        return _WholeObjectFile(path, binary=True, min_interval=0.0)  # tensorboardX throttles

    def directory_check(self, path: str) -> None:
        pass                                     # object stores have no directories to make


def _drop_rows_after(path: str, step: int) -> None:
    """A resumed run replays the steps after its checkpoint: drop their old rows first, so
    metrics.jsonl holds each step once."""
    target = storage.path(path)
    if not target.exists():
        return
    lines = [line for line in target.read_text(encoding="utf-8").splitlines(keepends=True)
             if line.strip()]
    kept = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) <= step:
                kept.append(line if line.endswith("\n") else line + "\n")
        except json.JSONDecodeError:   # a row cut short by a kill
            pass
    if len(kept) < len(lines):
        target.write_text("".join(kept), encoding="utf-8")


def read_metrics(path: str) -> list[dict]:
    """The records of a ``metrics.jsonl`` file (local or in a bucket)."""
    text = storage.path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def read_tensorboard_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """``{tag: [(step, value), ...]}`` from the event files in ``logdir`` (local or in a
    bucket; CRC-checked)."""
    tensorboardX = _tensorboardx()
    event_pb2 = tensorboardX.proto.event_pb2
    masked_crc32c = tensorboardX.record_writer.masked_crc32c

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(storage.path(logdir).glob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            header = data[pos:pos + 8]
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
            record = data[pos + 12:pos + 12 + length]
            (record_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
            if header_crc != masked_crc32c(header) or record_crc != masked_crc32c(record):
                raise ValueError(f"corrupt record at byte {pos} of {path}")
            pos += 16 + length
            event = event_pb2.Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out
