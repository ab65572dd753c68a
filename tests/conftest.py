"""Test setup: 8 fake CPU devices and a persistent compilation cache.

Both must be set before JAX initialises its backends, so this runs at import.
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

jax.config.update("jax_compilation_cache_dir",
                  os.environ.get("T2T_JAX_CACHE", os.path.expanduser("~/.cache/t2t/jax_cache")))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_gin_config():
    """gin bindings are global: no test sees another test's."""
    gin.clear_config()
    yield
    gin.clear_config()
