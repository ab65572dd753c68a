"""Which JAX backends the command line starts, decided before JAX initialises any.

libtpu (the `tpu` and `test` extras) is also what `t2t compile` uses to compile for TPU
topologies on a CPU-only machine; there, JAX would still try to open a TPU at start-up and
print libtpu's warnings about TPU_ACCELERATOR_TYPE and worker hostnames before falling back
to the CPU. Off a TPU host the command line therefore asks for the CPU (and CUDA, when its
plugin is installed) explicitly. `JAX_PLATFORMS` set by the user always wins.
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Mapping, Optional

from t2t.errors import UserError

# Set on Cloud TPU VMs (and by `t2t launch`); any of them means "this host has TPUs".
TPU_ENV = ("TPU_WORKER_HOSTNAMES", "CLOUD_TPU_TASK_ID", "TPU_ACCELERATOR_TYPE", "TPU_NAME")
CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")


def on_tpu_host(environ: Mapping[str, str] = os.environ) -> bool:
    """TPU chips are visible (/dev/accel*, /dev/vfio on newer VMs) or the TPU env is set."""
    return (any(environ.get(k) for k in TPU_ENV) or bool(glob.glob("/dev/accel*"))
            or os.path.isdir("/dev/vfio"))


def default_platforms(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The JAX_PLATFORMS value to set, or None to leave JAX's own choice."""
    if environ.get("JAX_PLATFORMS") or on_tpu_host(environ):
        return None
    if importlib.util.find_spec("libtpu") is None:
        return None                       # no libtpu: JAX's own choice is quiet and right
    cuda = any(importlib.util.find_spec(p) is not None for p in CUDA_PLUGINS)
    return "cuda,cpu" if cuda else "cpu"


def set_default_platforms() -> None:
    """Apply `default_platforms()` to this process (call before JAX starts a backend; JAX
    may already be imported)."""
    choice = default_platforms()
    if choice:
        os.environ["JAX_PLATFORMS"] = choice
        if "jax" in sys.modules:          # imported already: its config read the env then
            sys.modules["jax"].config.update("jax_platforms", choice)


def cache_dir() -> Path:
    """``$T2T_CACHE_DIR`` or ``~/.cache/t2t``: what t2t keeps per machine (lazily built
    vocabularies, the measured matmul peak)."""
    return Path(os.environ.get("T2T_CACHE_DIR", Path.home() / ".cache" / "t2t"))


# JAX's persistent compilation cache for the command line: a run that compiles the same
# program as an earlier one (a resumed run, the next cell of a grid, `t2t eval` after
# `t2t train`) reads the executable back instead of compiling it again.
# T2T_COMPILATION_CACHE=DIR moves it, T2T_COMPILATION_CACHE=off turns it off. Its size is
# kept under T2T_COMPILATION_CACHE_MAX_GB (default 4) by dropping the entries used longest ago.
COMPILATION_CACHE_ENV = "T2T_COMPILATION_CACHE"
DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "t2t", "jax_cache")
CACHE_MAX_GB_ENV = "T2T_COMPILATION_CACHE_MAX_GB"
DEFAULT_CACHE_MAX_GB = 4.0


def compilation_cache_dir(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The cache directory the command line should give JAX, or None: turned off, or left
    to JAX's own JAX_COMPILATION_CACHE_DIR."""
    setting = environ.get(COMPILATION_CACHE_ENV, DEFAULT_COMPILATION_CACHE).strip()
    if setting.lower() in ("", "0", "off", "none", "false") or environ.get(
            "JAX_COMPILATION_CACHE_DIR"):
        return None
    return os.path.expanduser(setting)


def enable_compilation_cache() -> Optional[str]:
    """Point JAX's persistent cache at `compilation_cache_dir()` unless something already
    chose one, pruned to `cache_max_bytes()`; JAX's own threshold stays (programs that took
    ≥ 1 s to compile). Returns the directory in use, or None."""
    import jax
    current = jax.config.jax_compilation_cache_dir
    path = compilation_cache_dir()
    if current or path is None:
        return current
    max_bytes = cache_max_bytes()
    jax.config.update("jax_compilation_cache_dir", path)
    prune_compilation_cache(path, max_bytes)
    return path


def cache_max_bytes(environ: Mapping[str, str] = os.environ) -> int:
    """T2T_COMPILATION_CACHE_MAX_GB in bytes (default 4 GB)."""
    setting = environ.get(CACHE_MAX_GB_ENV, "").strip()
    try:
        gigabytes = float(setting) if setting else DEFAULT_CACHE_MAX_GB
    except ValueError:
        gigabytes = math.nan
    if not 0 <= gigabytes < math.inf:
        raise UserError(f"{CACHE_MAX_GB_ENV}={setting!r} is not a number of gigabytes; "
                        f"set it to e.g. 4, or unset it")
    return int(gigabytes * 1e9)


def prune_compilation_cache(path: str, max_bytes: int) -> int:
    """Delete the cache's least recently used entries (by access, else modification time)
    until its files take at most `max_bytes`; returns how many were deleted. JAX's own
    limit (jax_compilation_cache_max_size) would take a file lock on every read and needs
    access-time files that a cache written without it lacks."""
    if not os.path.isdir(path):
        return 0
    entries = []
    with os.scandir(path) as files:
        for entry in files:
            if entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                entries.append((max(stat.st_atime, stat.st_mtime), stat.st_size, entry.path))
    total = sum(size for _, size, _ in entries)
    deleted = 0
    for _, size, file in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(FileNotFoundError):   # another process got there first
            os.remove(file)
        total -= size
        deleted += 1
    return deleted
