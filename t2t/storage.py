"""Run directories on local disk or in a bucket: `--gin.MODEL_DIR=gs://bucket/run` works.

Every file t2t writes under MODEL_DIR goes through `etils.epath` (which orbax uses too):
local paths as they are, `gs://` through gcsfs (the `gcs` extra; `s3://` needs s3fs).
Checkpoint arrays go through tensorstore, which speaks gs:// itself. Object stores cannot
append to a file, so files that grow (metrics.jsonl, TensorBoard event files) are rewritten
whole now and then; see `t2t.train.metrics_log`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from typing import Union

from etils import epath

from t2t.errors import UserError

PathLike = Union[str, os.PathLike]


def sha256_file(path: PathLike) -> str:
    """The hex sha256 of a local file, read a MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
# What each bucket scheme needs installed, and the pip line that installs it.
_NEEDS = {"gs": (("gcsfs",), "pip install 't2t[gcs]' (gcsfs)"),
          "s3": (("s3fs",), "pip install s3fs")}


def is_remote(path: PathLike) -> bool:
    """True for a bucket URL (`gs://...`, `s3://...`), False for a local path."""
    return "://" in os.fspath(path)


def path(p: PathLike) -> epath.Path:
    """An `epath.Path` for a local path (made absolute) or a bucket URL."""
    return epath.Path(p if is_remote(p) else os.path.abspath(os.fspath(p)))


def check(p: PathLike, what: str = "MODEL_DIR") -> None:
    """A one-line UserError if `p` is in a bucket t2t cannot reach (library missing)."""
    text = os.fspath(p)
    if not is_remote(text):
        return
    scheme = text.split("://", 1)[0]
    if scheme not in _NEEDS:
        raise UserError(f"{what} {text}: unknown storage scheme {scheme}://; use a local path, "
                        f"{', '.join(s + '://' for s in _NEEDS)}")
    modules, install = _NEEDS[scheme]
    missing = [m for m in modules if not _installed(m)]
    if missing:
        raise UserError(f"{what} {text} needs {', '.join(missing)}: {install}")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:        # a parent package is missing
        return False


def write_json_atomically(p: PathLike, value) -> None:
    """Write `value` as indented, key-sorted JSON to the local file `p` through a temporary
    file and a rename, so no reader (another process, a rerun after a kill) sees half of it;
    its directory is created first."""
    p = os.fspath(p)
    os.makedirs(os.path.dirname(p) or ".", exist_ok=True)
    tmp = f"{p}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, p)


def write_text(p: PathLike, text: str) -> epath.Path:
    """Write `text` to `p` (its directory is created first); the path written."""
    target = path(p)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target
