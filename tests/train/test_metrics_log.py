"""MetricsLogger: JSONL, TensorBoard event files, progress bar postfix."""
import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from t2t.train import metrics_log as tlog
from tests.jax_setup import cpu_env


class _Boom:
    """A metric that must never be read on a step that is not logged."""

    def __array__(self, *a, **k):
        raise AssertionError("metrics of an unlogged step were fetched")


def test_jsonl_tensorboard_and_cadence(tmp_path):
    d = str(tmp_path / "run")
    with tlog.MetricsLogger(d, total_steps=25, every_n=10, progress_bar=True) as log:
        for step in range(1, 26):
            metrics = ({"loss": jnp.float32(3.0 / step), "learning_rate": 1e-3 * step,
                        "tokens_per_second": np.float64(1234.5), "note": "ok",
                        "hist": jnp.arange(3)}
                       if log.should_log(step) else {"loss": _Boom()})
            wrote = log.log(step, metrics)
            assert wrote == (step in (10, 20, 25))
        assert log._bar.n == 25
        postfix = log._bar.postfix
        assert "loss=0.12" in postfix and "lr=2.50e-02" in postfix and "tok/s=1,234" in postfix

    records = tlog.read_metrics(os.path.join(d, "metrics.jsonl"))
    assert [r["step"] for r in records] == [10, 20, 25]
    assert records[0]["loss"] == pytest.approx(0.3) and records[0]["note"] == "ok"
    assert records[0]["hist"] == [0, 1, 2]
    assert isinstance(records[0]["loss"], float)
    with open(os.path.join(d, "metrics.jsonl")) as f:  # one JSON object per line
        assert all(json.loads(line)["step"] for line in f)

    scalars = tlog.read_tensorboard_scalars(os.path.join(d, "tensorboard"))
    assert set(scalars) == {"loss", "learning_rate", "tokens_per_second"}
    assert [s for s, _ in scalars["loss"]] == [10, 20, 25]
    np.testing.assert_allclose([v for _, v in scalars["loss"]], [0.3, 0.15, 0.12], rtol=1e-6)


def test_resume_appends_and_force(tmp_path):
    d = str(tmp_path)
    with tlog.MetricsLogger(d, total_steps=100, every_n=50, progress_bar=False) as log:
        log.log(50, {"loss": 1.0})
    with tlog.MetricsLogger(d, total_steps=100, every_n=50, initial_step=50,
                            progress_bar=False, tensorboard=False) as log:
        assert log.log(51, {"loss": 0.5}, force=True)
        log.log(52, {"loss": 0.4})  # not due
    assert [r["step"] for r in tlog.read_metrics(os.path.join(d, "metrics.jsonl"))] == [50, 51]


def test_corrupt_event_file_detected(tmp_path):
    d = str(tmp_path)
    with tlog.MetricsLogger(d, every_n=1, progress_bar=False) as log:
        log.log(1, {"loss": 2.0})
    tb = os.path.join(d, "tensorboard")
    (path,) = [os.path.join(tb, f) for f in os.listdir(tb)]
    data = bytearray(open(path, "rb").read())
    data[-6] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ValueError, match="corrupt record"):
        tlog.read_tensorboard_scalars(tb)


def test_only_process_zero_writes(tmp_path, monkeypatch):
    monkeypatch.setattr(tlog.jax, "process_index", lambda: 1)
    d = str(tmp_path / "other")
    with tlog.MetricsLogger(d, every_n=1) as log:
        assert not log.log(1, {"loss": 1.0})
    assert not os.path.exists(d)


def test_tensorboardx_comes_without_torch_and_torch_still_imports():
    """A fresh interpreter: the event writer does not pull in torch (over a second of every
    run's start), and torch imports normally afterwards."""
    code = ("import sys\n"
            "from t2t.train.metrics_log import _tensorboardx\n"
            "tb = _tensorboardx()\n"
            "assert tb.SummaryWriter and 'torch' not in sys.modules, 'torch came in'\n"
            "import torch\n"
            "assert torch.zeros(2).sum().item() == 0\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=cpu_env())
    assert done.returncode == 0, done.stderr[-2000:]
