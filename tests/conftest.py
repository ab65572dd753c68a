"""Test setup: 8 fake CPU devices and a persistent compilation cache (`tests/jax_setup.py`).

Both must be set before JAX initialises its backends, so this runs at import.

A mesh that a test does not give devices to (`partitioning.make_mesh(devices=None)`: the
trainer, fine-tuning, the CLI run in-process) spans one of the 8 devices, unless the test is
marked `all_devices` (the trainer, sharding, partitioning, checkpoint and two-process tests,
and those that ask for an 8-way mesh shape), which get all 8. On 2 cores a tiny model's 8-way
SPMD step costs a quarter to a third more to compile than its one-device step, and checks
nothing more about a fine-tuning head or a data pipeline. (`t2t` subprocesses get one device
too: `cpu_env`.)
"""
import os
import shutil
import tempfile

from tests.jax_setup import CACHE_SETTINGS, xla_flags

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {xla_flags(8)}".strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402

for _name, _value in CACHE_SETTINGS.items():
    jax.config.update(_name, _value)

import gin  # noqa: E402
import pytest  # noqa: E402

# What t2t keeps per machine, datasets (`t2t data build`) and the per-machine cache (vocabularies,
# the measured matmul peak), starts empty in every session, as on a fresh machine: a test that
# needs a dataset or a vocabulary builds it or a stand-in, whatever an earlier run left in
# ~/.cache/t2t. (The compilation cache above is kept: it changes how fast, not what, runs.)
MACHINE_STATE = ("T2T_DATA_DIR", "T2T_CACHE_DIR")
_state_roots = []


def pytest_configure(config):
    if hasattr(config, "workerinput"):           # an xdist worker: the controller set them
        return
    root = tempfile.mkdtemp(prefix="t2t-tests-")
    _state_roots.append(root)
    for name in MACHINE_STATE:
        os.environ[name] = os.path.join(root, name.lower())


def pytest_unconfigure(config):
    while _state_roots:
        shutil.rmtree(_state_roots.pop(), ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """While `item` runs (setup, its fixtures' included, call and teardown), a mesh built
    without devices spans all 8 if it is marked `all_devices`, else one."""
    from t2t.train import partitioning
    marked = item.get_closest_marker("all_devices") is not None
    with partitioning.target_devices(jax.devices() if marked else jax.devices()[:1]):
        return (yield)


@pytest.fixture(autouse=True)
def _fresh_gin_config():
    """gin bindings are global: no test sees another test's."""
    gin.clear_config()
    yield
    gin.clear_config()


# The test files whose tests run longest (subprocess runs, whole grids), run first: with
# `pytest -n 2` the last minute then holds short tests that both workers share, instead of
# one worker finishing a 50-second test while the other waits. Order only; nothing else.
LONGEST_FIRST = ("tests/train/test_resume.py", "tests/train/test_multihost.py",
                 "tests/ablations/test_runner.py", "tests/ablations/test_gpu_table2.py",
                 "tests/test_wheel.py", "tests/test_docs.py",
                 "tests/train/test_remote_model_dir.py", "tests/train/test_interrupt.py",
                 "tests/train/test_finetune.py", "tests/nn/test_sharding.py")


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
