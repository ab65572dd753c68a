"""The suite's JAX settings: conftest applies them, and tests that start a Python subprocess
pass them on with `cpu_env`."""
import os

CACHE_DIR = os.environ.get("T2T_JAX_CACHE", os.path.expanduser("~/.cache/t2t/jax_cache"))
# Every compiled program goes into the persistent cache, however quick its compile: the suite
# compiles thousands of small ones, and reading them back is a quarter faster than compiling.
CACHE_SETTINGS = {"jax_compilation_cache_dir": CACHE_DIR,
                  "jax_persistent_cache_min_compile_time_secs": 0,
                  "jax_persistent_cache_min_entry_size_bytes": 0}


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for `devices` fake CPU devices, their machine code compiled by LLVM at -O0 and
    XLA:CPU's classic fusion emitter instead of its MLIR one: the suite's programs are tiny, so
    compiling them costs more than running them, and the MLIR emitter took 3x the compile CPU
    time (the sharding tests' 9 programs: 28-31 s against 8-12 s). XLA's HLO passes (layout,
    sharding) are those of a normal run; its fusion differs a little (the classic emitter
    takes fewer kinds of fusion), so bitwise comparisons hold within one program setting."""
    return (f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
            " --xla_cpu_use_fusion_emitters=false")


def cpu_env(devices: int = 1, **extra: str) -> dict:
    """The environment for a subprocess on `devices` fake CPU devices with the suite's
    compilation cache; `extra` adds or overrides variables."""
    return {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": xla_flags(devices),
            **{name.upper(): str(value) for name, value in CACHE_SETTINGS.items()}, **extra}
