"""`TransformerConfig.dtype="auto"`: bfloat16 matmuls where the device runs them faster.

bfloat16 here means bf16 matmul inputs with float32 accumulation (`preferred_element_type`)
and float32 parameters; norms, softmax, losses and the optimizer stay float32 (t2t.nn).
That is faster on TPUs, on NVIDIA GPUs from compute capability 8.0 (Ampere) and on CPUs
with native bf16 dot instructions (AVX512_BF16, AMX-BF16). On an AVX2-only CPU XLA
emulates the bf16 dot and it runs slower than float32 (benchmarks/RESULTS.md: 107 vs 176
GFLOP/s), so "auto" keeps float32 there. CPUs whose flags say nothing (not x86, or no
/proc/cpuinfo) are asked by a short matmul probe instead. The environment variable
T2T_AUTO_DTYPE (float32 or bfloat16) overrides the choice without changing the config, so a
grid started on one kind of host continues in its precision on another (docs/ablations).

The choice is made once per process, logged in one line and written to config.gin.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import platform as platform_lib
import time
from pathlib import Path
from typing import Callable, FrozenSet, Optional

from t2t.errors import ConfigError

_log = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")          # native bf16 dot products on x86
REPORTED_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "avx512f", "avx2")
X86_MACHINES = ("x86_64", "amd64", "i386", "i686")
GPU_PLATFORMS = ("gpu", "cuda", "rocm")  # JAX's names for a GPU backend
MIN_GPU_CAPABILITY = 8.0     # Ampere: bf16 tensor cores
PROBE_MIN_SPEEDUP = 1.2      # bf16 must beat float32 by this much to be chosen by the probe
AUTO_DTYPE_ENV = "T2T_AUTO_DTYPE"   # float32 | bfloat16: what "auto" means, whatever the host


@dataclasses.dataclass(frozen=True)
class Choice:
    """What "auto" resolved to, and why (for the log line and config.gin)."""

    dtype: str      # "bfloat16" or "float32"
    reason: str     # e.g. "avx512_bf16 on this CPU"

    def describe(self) -> str:
        what = "bfloat16 matmuls" if self.dtype == "bfloat16" else "float32"
        return f"{what} ({self.reason})"


# ------------------------------------------------------------------------ the host
def read_cpuinfo() -> Optional[str]:
    """The text of /proc/cpuinfo, or None where there is none (macOS, Windows)."""
    try:
        return CPUINFO.read_text()
    except OSError:
        return None


def cpu_flags(cpuinfo: Optional[str]) -> Optional[FrozenSet[str]]:
    """The first processor's feature flags (x86 `flags`, Arm `Features`), or None."""
    if cpuinfo is None:
        return None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return None


def cpu_model(cpuinfo: Optional[str]) -> str:
    """e.g. 'AMD EPYC 9B14' from /proc/cpuinfo, else what `platform` knows."""
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return platform_lib.processor() or platform_lib.machine() or "unknown CPU"


# ------------------------------------------------------------------------ the choice
def choose(platform: str, *, cpu_flags: Optional[FrozenSet[str]] = None,
           machine: str = "x86_64", gpu_capability: Optional[str] = None,
           probe: Optional[Callable[[], float]] = None) -> Choice:
    """The dtype "auto" means on a device of `platform` ("cpu", "gpu", "tpu", ...).

    cpu_flags: the CPU's flags (None: unknown); machine: `platform.machine()`;
    gpu_capability: a CUDA device's compute capability ("9.0"); probe: returns how many
    times faster a bf16->f32 matmul runs than a float32 one, asked only when flags are mute.
    """
    if platform == "tpu":
        return Choice("bfloat16", "TPU")
    if platform in GPU_PLATFORMS:
        if _capability(gpu_capability) < MIN_GPU_CAPABILITY:
            return Choice("float32", f"GPU compute capability {gpu_capability} has no bf16 "
                                     "tensor cores")
        return Choice("bfloat16", "GPU" if gpu_capability is None
                      else f"GPU compute capability {gpu_capability}")
    if platform != "cpu":
        return Choice("float32", f"{platform} device")
    if cpu_flags is not None and machine.lower() in X86_MACHINES:
        native = [f for f in BF16_CPU_FLAGS if f in cpu_flags]
        if native:
            return Choice("bfloat16", f"{' and '.join(native)} on this CPU")
        best = next((f for f in ("avx512f", "avx2") if f in cpu_flags), "no AVX2")
        return Choice("float32", f"this CPU has {best} but no avx512_bf16/amx_bf16")
    if probe is None:
        return Choice("float32", "CPU without known bf16 support")
    speedup = probe()
    dtype = "bfloat16" if speedup >= PROBE_MIN_SPEEDUP else "float32"
    return Choice(dtype, f"bf16 matmul {speedup:.2f}x float32 in a start-up probe")


def _capability(value: Optional[str]) -> float:
    """A CUDA compute capability as a number; unknown (None, ROCm's 'gfx90a') counts as new."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("inf")


def probe_bf16_speedup(size: int = 1024, repeats: int = 5) -> float:
    """float32 time / bf16->float32 time of a jitted [size, size]² matmul, best of `repeats`."""
    import jax
    import jax.numpy as jnp

    def best_time(dtype) -> float:
        a = jnp.ones((size, size), dtype)
        f = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
        f(a).block_until_ready()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            f(a).block_until_ready()
            times.append(time.perf_counter() - start)
        return min(times)

    return best_time(jnp.float32) / best_time(jnp.bfloat16)


def from_environment() -> Optional[Choice]:
    """The choice T2T_AUTO_DTYPE asks for, or None where it is unset or empty."""
    wanted = os.environ.get(AUTO_DTYPE_ENV, "").strip()
    if not wanted:
        return None
    if wanted not in ("float32", "bfloat16"):
        raise ConfigError(f"{AUTO_DTYPE_ENV}={wanted!r}; set it to float32 or bfloat16, or "
                          "unset it to let the host decide")
    return Choice(wanted, f"{AUTO_DTYPE_ENV}={wanted} in the environment")


def device_choice() -> Choice:
    """`choose` for this process's default device."""
    import jax
    device = jax.devices()[0]
    cpuinfo = read_cpuinfo() if device.platform == "cpu" else None
    return choose(device.platform, cpu_flags=cpu_flags(cpuinfo),
                  machine=platform_lib.machine(),
                  gpu_capability=getattr(device, "compute_capability", None),
                  probe=probe_bf16_speedup)


@functools.lru_cache(maxsize=None)
def auto_choice() -> Choice:
    """`from_environment`, else `device_choice`: made once per process and logged once."""
    choice = from_environment() or device_choice()
    _log.info("precision: %s", choice.describe())
    return choice


def resolve_dtype(dtype: str) -> str:
    """`dtype` itself, or what "auto" means on this host."""
    return auto_choice().dtype if dtype == "auto" else dtype
