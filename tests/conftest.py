"""Test setup: 8 fake CPU devices and a persistent compilation cache (`tests/jax_setup.py`).

Both must be set before JAX initialises its backends, so this runs at import.
"""
import os

from tests.jax_setup import CACHE_SETTINGS, xla_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_flags(8)}".strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

for _name, _value in CACHE_SETTINGS.items():
    jax.config.update(_name, _value)

import gin  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_gin_config():
    """gin bindings are global: no test sees another test's."""
    gin.clear_config()
    yield
    gin.clear_config()
