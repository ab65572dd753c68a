"""Which JAX backends the command line starts, decided before JAX initialises any.

libtpu (the `tpu` and `test` extras) is also what `t2t compile` uses to compile for TPU
topologies on a CPU-only machine; there, JAX would still try to open a TPU at start-up and
print libtpu's warnings about TPU_ACCELERATOR_TYPE and worker hostnames before falling back
to the CPU. Off a TPU host the command line therefore asks for the CPU (and CUDA, when its
plugin is installed) explicitly. `JAX_PLATFORMS` set by the user always wins.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Mapping, Optional

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


# JAX's persistent compilation cache for the command line: a run that compiles the same
# program as an earlier one (a resumed run, the next cell of a grid, `t2t eval` after
# `t2t train`) reads the executable back instead of compiling it again.
# T2T_COMPILATION_CACHE=DIR moves it, T2T_COMPILATION_CACHE=off turns it off.
COMPILATION_CACHE_ENV = "T2T_COMPILATION_CACHE"
DEFAULT_COMPILATION_CACHE = os.path.join("~", ".cache", "t2t", "jax_cache")


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
    chose one; JAX's own threshold stays (programs that took ≥ 1 s to compile). Returns the
    directory in use, or None."""
    import jax
    current = jax.config.jax_compilation_cache_dir
    path = compilation_cache_dir()
    if current or path is None:
        return current
    jax.config.update("jax_compilation_cache_dir", path)
    return path
