"""One run per MODEL_DIR: `t2t train` and `t2t finetune` hold `MODEL_DIR/.t2t.lock`.

The lock is a small JSON file (host, pid, start time, command) that process 0 of a run
creates before anything else is written to MODEL_DIR and deletes when the run ends, however
it ends (done, preempted, an exception). A second run on the same MODEL_DIR stops with one
line naming the holder. A lock is taken over, with one warning, when it is stale:

- its host is this host and its process is gone (a run killed by SIGKILL or a crash);
- its host is another host and it is older than `T2T_LOCK_STALE_HOURS` (default 24): a
  process on another machine cannot be checked from here.

A local lock is created atomically (written to a temporary file, then `os.link`ed to its
name, which fails if the name exists), so two runs starting together cannot both take it.
A lock in a bucket (gs://) is created with a generation precondition (gcsfs's exclusive
mode, `ifGenerationMatch=0`), so of two runs starting together one gets it; on a store that
ignores preconditions (the GCS emulator the tests use) it is read, then written. Taking
over a stale lock deletes it and creates it anew; a run that took it over in between wins,
the other reports it.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from typing import Iterator, Optional

import jax

from t2t import storage
from t2t.errors import UserError

_log = logging.getLogger(__name__)

LOCK_NAME = ".t2t.lock"
STALE_HOURS_ENV = "T2T_LOCK_STALE_HOURS"   # a lock from another host older than this is stale
DEFAULT_STALE_HOURS = 24.0


class ModelDirInUseError(UserError):
    """Another live run holds MODEL_DIR's lock."""


def stale_hours(environ=os.environ) -> float:
    """`T2T_LOCK_STALE_HOURS` as a number of hours (default 24)."""
    text = environ.get(STALE_HOURS_ENV, "").strip()
    if not text:
        return DEFAULT_STALE_HOURS
    try:
        hours = float(text)
    except ValueError:
        hours = -1.0
    if not hours >= 0 or hours == float("inf"):
        raise UserError(f"{STALE_HOURS_ENV}={text!r} is not a number of hours; set it to e.g. "
                        f"{DEFAULT_STALE_HOURS:g} or unset it")
    return hours


def _alive(pid: int) -> bool:
    """Whether process `pid` exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:        # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def _in_use(model_dir: str, path, holder: Optional[dict]) -> str:
    """The one line for a MODEL_DIR whose lock `holder` holds."""
    holder = holder or {}
    started = holder.get("started")
    since = _when(started) if isinstance(started, (int, float)) else "an unknown time"
    command = holder.get("command") or "command unknown"
    return (f"MODEL_DIR {model_dir} is in use by pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')} since {since} ({command}); wait for it or remove "
            f"{path} if it is dead")


class RunLock:
    """`MODEL_DIR/.t2t.lock`: `acquire` it, `release` it (both on process 0 only)."""

    def __init__(self, model_dir: str, command: str = ""):
        self.model_dir = os.fspath(model_dir)
        self.remote = storage.is_remote(self.model_dir)
        self.path = storage.path(self.model_dir) / LOCK_NAME
        self.info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                     "command": command}
        self._made_dir = False
        self.held = False

    # ------------------------------------------------------------------ acquire / release
    def acquire(self) -> None:
        """Takes the lock; a ModelDirInUseError (one line) if a live run holds it."""
        storage.check(self.model_dir)              # gs:// without gcsfs: one line, now
        root = storage.path(self.model_dir)
        if not self.remote and not root.exists():
            self._made_dir = True
        root.mkdir(parents=True, exist_ok=True)
        if self._create():
            self.held = True
            return
        holder = self._read()
        reason = self._stale(holder)
        if reason is None:
            raise ModelDirInUseError(_in_use(self.model_dir, self.path, holder))
        _log.warning("taking over %s: %s", self.path, reason)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        if not self._create():                     # another run took it over first
            raise ModelDirInUseError(_in_use(self.model_dir, self.path, self._read()))
        self.held = True

    def release(self) -> None:
        """Deletes the lock if it is still this run's; removes MODEL_DIR too if this run
        created it and left it empty (a run that stopped before writing anything)."""
        if not self.held:
            return
        self.held = False
        try:
            if self._read() == self.info:
                self.path.unlink()
        except OSError as e:
            _log.warning("could not remove %s: %s", self.path, e)
        if self._made_dir:
            with contextlib.suppress(OSError):
                os.rmdir(self.model_dir)           # only if empty

    # ------------------------------------------------------------------ the file
    def _create(self) -> bool:
        """Creates the lock file with this run's info; False if it exists already."""
        text = json.dumps(self.info, indent=1, sort_keys=True) + "\n"
        if self.remote:
            return self._create_remote(text)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, self.path)                # atomic: fails if the lock exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def _create_remote(self, text: str) -> bool:
        """In a bucket: an exclusive create ("xb": gcsfs sends ifGenerationMatch=0, and GCS
        answers 412, FileExistsError, if the object exists), after a read that saves the
        request when it plainly does. A store without preconditions (the GCS emulator)
        makes it check-then-write."""
        import fsspec
        if self.path.exists():
            return False
        try:
            with fsspec.open(str(self.path), "xb") as f:
                f.write(text.encode("utf-8"))
        except FileExistsError:
            return False
        return True

    def _read(self) -> Optional[dict]:
        """The holder's info; None if the file is gone; {} if it cannot be read."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError:
            return {}
        return holder if isinstance(holder, dict) else {}

    def _stale(self, holder: Optional[dict]) -> Optional[str]:
        """Why `holder`'s lock may be taken over (one phrase), or None if it holds."""
        if holder is None:
            return "its holder released it"
        if not holder or not isinstance(holder.get("pid"), int):
            return "the lock file cannot be read"
        pid, host = holder["pid"], holder.get("host")
        if host == self.info["host"]:
            return None if _alive(pid) else f"pid {pid} on {host} is gone"
        started = holder.get("started")
        hours = stale_hours()
        if isinstance(started, (int, float)) and time.time() - started > hours * 3600:
            return (f"pid {pid} on {host} took it at {_when(started)}, more than {hours:g} h "
                    f"ago ({STALE_HOURS_ENV})")
        return None


@contextlib.contextmanager
def model_dir_lock(model_dir: str, command: str = "") -> Iterator[Optional[RunLock]]:
    """Holds MODEL_DIR's lock for the `with` block (process 0; other processes: None)."""
    if jax.process_index() != 0:
        yield None
        return
    lock = RunLock(model_dir, command)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
