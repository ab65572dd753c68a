"""MODEL_DIR in a bucket: checkpoints, metrics.jsonl, TensorBoard, config.gin and fine-tuning
results go to gs:// (a local GCS emulator, tests/train/gcs_emulator.py) and come back."""
import json

import jax
import numpy as np
import pytest
from etils import epath

from t2t import gin_utils, storage
from t2t.errors import UserError
from t2t.evaluation import evaluator
from t2t.train import experiment, finetune
from t2t.train.checkpoints import Checkpointer
from t2t.train.logging import read_metrics, read_tensorboard_scalars
from tests.train.gcs_emulator import emulated_gcs


@pytest.fixture(scope="module")
def bucket():
    with emulated_gcs() as url:
        yield url


def test_checkpoints_round_trip_through_the_bucket(bucket):
    tree = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "step": np.int32(7)}
    with Checkpointer(f"{bucket}/ckpt", keep=2, async_save=False) as ckpt:
        assert ckpt.directory == f"{bucket}/ckpt"
        for step in (1, 2, 3):
            ckpt.save(step, jax.tree.map(lambda x: x + step, tree), {"epoch": step}, "A = 1")
    again = Checkpointer(f"{bucket}/ckpt", async_save=False)
    assert again.all_steps() == [2, 3]                 # keep=2 deleted step 1 in the bucket
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        np.shape(x), x.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])),
        tree)
    state, data = again.restore(None, target)
    np.testing.assert_array_equal(state["w"], tree["w"] + 3)
    assert int(state["step"]) == 10 and data == {"epoch": 3}
    assert again.config_str() == "A = 1"
    again.close()


def test_results_are_written_to_the_bucket(bucket):
    results = {"bbc/test": {"accuracy": 97.25}}
    json_path, md_path = evaluator.write_results(results, f"{bucket}/eval")
    assert str(json_path) == f"{bucket}/eval/metrics.json"
    assert json.loads(epath.Path(f"{bucket}/eval/metrics.json").read_text()) == results
    assert "| bbc/test | 97.25 |" in epath.Path(f"{bucket}/eval/results.md").read_text()


def test_unreachable_bucket_is_one_line_before_anything_runs(monkeypatch):
    storage.check("/tmp/local_run")                          # local: nothing to check
    monkeypatch.setattr(storage, "_installed", lambda module: module != "gcsfs")
    with pytest.raises(UserError, match=r"^MODEL_DIR gs://b/run needs gcsfs: pip install"):
        storage.check("gs://b/run")
    with pytest.raises(UserError, match="unknown storage scheme hdfs://"):
        storage.check("hdfs://b/run")
