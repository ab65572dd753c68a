"""MODEL_DIR in a bucket: checkpoints, metrics.jsonl, TensorBoard, config.gin and fine-tuning
results go to gs:// (a local GCS emulator, tests/train/gcs_emulator.py) and come back."""
import json
import types

import jax
import numpy as np
import pytest
from etils import epath

from t2t import storage
from t2t.run import gin_utils
from t2t.errors import UserError
from t2t.train import evaluator, run_lock
from t2t.run import experiment
from t2t.train.checkpoints import Checkpointer, restore_params
from t2t.train.metrics_log import read_metrics, read_tensorboard_scalars
from t2t.train.trainer import restore_newest_readable
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


def test_a_training_run_lives_in_the_bucket_and_resumes_from_it(bucket, tmp_path,
                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)          # a gs:// path mistaken for a local one lands here
    model_dir = f"{bucket}/gpt_run"

    def train(steps):
        gin_utils.parse(["experiments/gpt_tiny_bible.gin", "models/gpt2/test.gin"], [
            f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {steps}", "BATCH_SIZE = 8",
            "TASK_FEATURE_LENGTHS = {'targets': 32}", "WARMUP_STEPS = 1",
            "TrainConfig.log_every = 1", "TrainConfig.checkpoint_every = 2",
            "TrainConfig.progress_bar = False"])
        return experiment.run()

    assert train(2).step == 2
    result = train(3)                    # resumes from the step-2 checkpoint in the bucket
    assert result.step == 3 and [h["step"] for h in result.history] == [3]
    root = epath.Path(model_dir)
    assert f"MODEL_DIR = '{model_dir}'" in (root / "config.gin").read_text()
    assert [r["step"] for r in read_metrics(f"{model_dir}/metrics.jsonl")] == [1, 2, 3]
    scalars = read_tensorboard_scalars(f"{model_dir}/tensorboard")
    assert [step for step, _ in scalars["loss"]] == [1, 2, 3]   # two event files, one per run
    assert Checkpointer(f"{model_dir}/checkpoints", async_save=False).all_steps() == [2, 3]
    restored = restore_params(model_dir)
    jax.tree.map(np.testing.assert_array_equal, restored, jax.device_get(result.state.params))
    assert list(tmp_path.iterdir()) == []


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


def test_train_cli_without_gcsfs_says_so_in_one_line(monkeypatch, capsys):
    from t2t.cli import main
    monkeypatch.setattr(storage, "_installed", lambda module: False)
    code = main(["train", "--gin_file=experiments/gpt_tiny_bible.gin",
                 "--gin_file=models/gpt2/test.gin", "--gin.MODEL_DIR=gs://nobucket/run"])
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error" in line]   # after progress lines
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert "MODEL_DIR gs://nobucket/run needs gcsfs: pip install 't2t[gcs]' (gcsfs)" in errors[0]


def test_a_lock_in_the_bucket_blocks_a_second_run_until_released(bucket):
    """A held lock in a bucket stops a second run until it is released."""
    first = run_lock.RunLock(f"{bucket}/locked", "t2t train first")
    first.acquire()
    assert json.loads(epath.Path(f"{bucket}/locked/.t2t.lock").read_text())["command"] \
        == "t2t train first"
    with pytest.raises(run_lock.ModelDirInUseError, match=r"is in use by pid \d+ on .* \(t2t "
                                                          r"train first\); wait for it"):
        run_lock.RunLock(f"{bucket}/locked", "t2t train second").acquire()
    first.release()
    assert not epath.Path(f"{bucket}/locked/.t2t.lock").exists()


def test_the_bucket_lock_is_an_exclusive_create(bucket, monkeypatch):
    """The lock object is written with gcsfs's exclusive mode (ifGenerationMatch=0): when
    another run creates it between the read and the write, GCS answers 412 (gcsfs raises
    FileExistsError) and this run reports the holder. (The emulator ignores preconditions,
    so the 412 is played here.)"""
    import fsspec
    modes = []

    def racing_open(url, mode="rb", **kwargs):
        modes.append(mode)
        raise FileExistsError(url)

    monkeypatch.setattr(fsspec, "open", racing_open)
    lock = run_lock.RunLock(f"{bucket}/raced", "t2t train")
    assert lock._create_remote("{}") is False and modes == ["xb"]


def test_an_unreadable_checkpoint_in_the_bucket_is_set_aside(bucket):
    tree = {"w": np.arange(4, dtype=np.float32)}
    directory = f"{bucket}/damaged/checkpoints"
    with Checkpointer(directory, keep=3, async_save=False) as ckpt:
        for step in (1, 2):
            ckpt.save(step, jax.tree.map(lambda x: x + step, tree), {"epoch": step})
    data = epath.Path(f"{directory}/2/data_state/process_0-of-1.json")
    data.write_text(data.read_text()[:5])                   # truncated
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0])), tree)
    trainer = types.SimpleNamespace(abstract_state=lambda state: target, tx=None)
    with Checkpointer(directory, keep=3, async_save=False) as ckpt:
        step, state, data_state = restore_newest_readable(ckpt, trainer, None)
        assert step == 1 and data_state == {"epoch": 1}
        ckpt.save(2, state, {"epoch": 2})                    # step 2 is free again
    assert epath.Path(f"{directory}/2.unreadable/data_state/process_0-of-1.json").read_text() == '{"epo'
    assert Checkpointer(directory, async_save=False).all_steps() == [1, 2]


def test_eval_reads_the_runs_config_from_the_bucket(bucket, capsys):
    """`t2t eval --gin.MODEL_DIR=gs://...` alone: the run's config.gin is read from the
    bucket; a run without a checkpoint says so in one line, before any data is read."""
    from t2t.cli import main
    model_dir = f"{bucket}/no_checkpoint_yet"
    storage.write_text(f"{model_dir}/config.gin",
                       "include 'experiments/finetune_t5_tiny_bible_en_es.gin'\n"
                       f"MODEL_DIR = '{model_dir}'\nINITIAL_CHECKPOINT = None\n")
    assert main(["eval", f"--gin.MODEL_DIR={model_dir}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"MODEL_DIR '{model_dir}' has no checkpoints" in err[0], err
