"""Faults lose nothing and say so: a checkpoint that cannot be read is set aside and the run
resumes from the newest readable one; a second run on a MODEL_DIR in use stops in one line;
a checkpoint save that fills the disk says which step was lost and which is intact."""
import errno
import json
import logging
import os
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from t2t.cli import main
from t2t.errors import EXIT_DISK_FULL, DiskFullError, UserError
from t2t.run import gin_utils
from t2t.train import run_lock
from t2t.train.checkpoints import Checkpointer
from t2t.train.trainer import restore_newest_readable

TINY = ["--gin_file=experiments/t5_tiny_bible.gin", "--gin_file=models/t5/1_1/test.gin",
        "--gin.BATCH_SIZE=8", "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
        "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.checkpoint_every=1",
        "--gin.TrainConfig.progress_bar=False"]


def train(model_dir, steps):
    return main(["train", *TINY, f"--gin.TRAIN_STEPS={steps}", f"--gin.MODEL_DIR={model_dir}"])


def _truncate_largest(directory):
    """Halves the largest file under `directory` (orbax's commit_success.txt markers, whose
    content nothing reads, aside), or `directory` itself if it is a file; the file's path."""
    files = [os.path.join(root, f) for root, _, names in os.walk(directory) for f in names
             if f != "commit_success.txt"] or [str(directory)]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)
    return largest


class _Trainer:
    """What `restore_newest_readable` asks of a Trainer, for a plain pytree."""
    tx = None

    def __init__(self, target):
        self.target = target

    def abstract_state(self, state):
        return self.target


def _tiny_checkpoints(directory, steps=(2, 4)):
    """Steps of a 64 x 64 array (its data file the state's largest), data and config."""
    tree = {"w": np.arange(4096, dtype=np.float32).reshape(64, 64)}
    with Checkpointer(str(directory), async_save=False) as ckpt:
        for step in steps:
            ckpt.save(step, jax.tree.map(lambda x: x + step, tree), {"epoch": step}, "A = 1")
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return _Trainer(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                                sharding=sharding), tree))


@pytest.mark.parametrize("kind", ["state", "state/_METADATA", "data_state", "config"])
def test_a_step_with_an_unreadable_item_is_set_aside_whole(tmp_path, caplog, kind):
    """The state's largest file or its tree metadata, the data iterator's state or the
    config, truncated: step 2 is restored, step 4 renamed 4.unreadable with every file kept,
    and step 4 can be saved again."""
    trainer = _tiny_checkpoints(tmp_path / "checkpoints")
    damaged = _truncate_largest(tmp_path / "checkpoints" / "4" / kind)
    size = os.path.getsize(damaged)
    with Checkpointer(str(tmp_path / "checkpoints"), async_save=False) as ckpt:
        with caplog.at_level(logging.WARNING, logger="t2t"):
            step, state, data = restore_newest_readable(ckpt, trainer, None)
        assert step == 2 and data == {"epoch": 2} and float(state["w"][0, 0]) == 2.0
        said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
        assert len(said) == 1 and "\n" not in said[0], said
        assert said[0].startswith("checkpoint 4 cannot be read (")
        assert "resuming from the newest readable one, step 2" in said[0]
        assert ckpt.all_steps() == [2]
        ckpt.save(4, state, {"epoch": 4}, "A = 1")            # the step is free again
        assert ckpt.all_steps() == [2, 4]
    with Checkpointer(str(tmp_path / "checkpoints"), async_save=False) as again:
        assert again.all_steps() == [2, 4]           # a later run does not take it for a step
    aside = tmp_path / "checkpoints" / "4.unreadable"
    assert os.path.getsize(damaged.replace(os.sep + "4" + os.sep, os.sep + "4.unreadable"
                                           + os.sep)) == size
    assert aside.is_dir() and (tmp_path / "checkpoints" / "4" / kind).exists()


def test_a_step_whose_own_orbax_metadata_is_truncated_still_restores(tmp_path):
    """The step directory's own _CHECKPOINT_METADATA (orbax's bookkeeping: item handlers,
    save time) is not needed to restore the step: orbax logs it, the step is used."""
    trainer = _tiny_checkpoints(tmp_path / "checkpoints")
    metadata = tmp_path / "checkpoints" / "4" / "_CHECKPOINT_METADATA"
    metadata.write_bytes(metadata.read_bytes()[:40])
    with Checkpointer(str(tmp_path / "checkpoints"), async_save=False) as ckpt:
        step, _, data = restore_newest_readable(ckpt, trainer, None)
    assert step == 4 and data == {"epoch": 4}
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]


def test_no_readable_checkpoint_is_one_user_error_and_nothing_is_moved(tmp_path):
    trainer = _tiny_checkpoints(tmp_path / "checkpoints")
    for step in ("2", "4"):
        _truncate_largest(tmp_path / "checkpoints" / step / "state")
    with Checkpointer(str(tmp_path / "checkpoints"), async_save=False) as ckpt:
        with pytest.raises(UserError) as error:
            restore_newest_readable(ckpt, trainer, None)
    summary = error.value.summary
    assert "\n" not in summary and summary.startswith(
        f"no checkpoint in {tmp_path / 'checkpoints'} can be read (steps 4, 2; step 4: ")
    assert "move the checkpoints directory aside to start from step 0" in summary
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]


def test_a_run_resumes_before_an_unreadable_checkpoint_and_saves_that_step_again(
        tmp_path, capsys):
    """End to end: the newest step's arrays truncated; `t2t train` says so in one line,
    resumes from the step before, trains through the damaged step and saves it again."""
    model_dir = tmp_path / "run"
    assert train(model_dir, 2) == 0
    damaged = _truncate_largest(model_dir / "checkpoints" / "2" / "state")
    capsys.readouterr()
    assert train(model_dir, 2) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "cannot be read" in line]
    assert len(said) == 1 and said[0].startswith("checkpoint 2 cannot be read ("), err
    assert f"resumed from step 1 ({model_dir})" in err
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["1", "2", "2.unreadable"]
    assert os.path.exists(damaged.replace(os.sep + "2" + os.sep, os.sep + "2.unreadable"
                                          + os.sep))


# ------------------------------------------------------------------ one run per MODEL_DIR
def _lock(model_dir, **info):
    model_dir.mkdir(parents=True, exist_ok=True)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
              "command": "t2t train --gin_file=x.gin", **info}
    (model_dir / run_lock.LOCK_NAME).write_text(json.dumps(holder))
    return holder


@pytest.fixture
def stub_run(monkeypatch):
    """`t2t train` without the training: records whether the lock was held during the run."""
    from t2t.run import experiment
    held = []

    def run():
        model_dir = gin_utils.query_macro("MODEL_DIR")
        held.append(json.loads(open(os.path.join(model_dir, run_lock.LOCK_NAME)).read()))
        return types.SimpleNamespace(stopped_by="done")

    monkeypatch.setattr(experiment, "run", run)
    return held


def _train_argv(model_dir):
    return ["train", *TINY, f"--gin.MODEL_DIR={model_dir}"]


def test_a_run_holds_the_lock_and_releases_it(tmp_path, stub_run, monkeypatch):
    assert main(_train_argv(tmp_path / "run")) == 0
    assert stub_run[0]["pid"] == os.getpid() and stub_run[0]["host"] == socket.gethostname()
    assert stub_run[0]["command"].startswith("t2t train --gin_file=experiments/t5_tiny_bible")
    assert not (tmp_path / "run" / run_lock.LOCK_NAME).exists()
    assert not (tmp_path / "run").exists()      # made for the lock, left empty: removed

    from t2t.run import experiment
    monkeypatch.setattr(experiment, "run", lambda: 1 / 0)
    assert main(_train_argv(tmp_path / "run")) == 1      # an exception releases it too
    assert not (tmp_path / "run").exists()


def test_a_second_run_on_a_model_dir_in_use_is_one_line(tmp_path, stub_run, capsys):
    holder = _lock(tmp_path / "run")                   # this process: alive, on this host
    assert main(_train_argv(tmp_path / "run")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert (f"error: MODEL_DIR {tmp_path / 'run'} is in use by pid {os.getpid()} on "
            f"{socket.gethostname()} since ") in err
    assert (f"(t2t train --gin_file=x.gin); wait for it or remove "
            f"{tmp_path / 'run' / run_lock.LOCK_NAME} if it is dead") in err
    assert stub_run == []
    assert json.loads((tmp_path / "run" / run_lock.LOCK_NAME).read_text()) == holder


def test_a_lock_whose_process_is_gone_is_taken_over_with_a_warning(tmp_path, stub_run,
                                                                   capsys):
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    _lock(tmp_path / "run", pid=gone.pid)
    assert main(_train_argv(tmp_path / "run")) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "taking over" in line]
    assert len(said) == 1 and f"pid {gone.pid} on {socket.gethostname()} is gone" in said[0]
    assert stub_run[0]["pid"] == os.getpid()
    assert not (tmp_path / "run" / run_lock.LOCK_NAME).exists()


def test_a_lock_from_another_host_holds_until_it_is_stale(tmp_path, stub_run, capsys,
                                                          monkeypatch):
    _lock(tmp_path / "run", host="elsewhere", pid=1, started=time.time() - 3 * 3600)
    assert main(_train_argv(tmp_path / "run")) == 2
    assert "is in use by pid 1 on elsewhere since " in capsys.readouterr().err
    monkeypatch.setenv(run_lock.STALE_HOURS_ENV, "2")
    assert main(_train_argv(tmp_path / "run")) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if "taking over" in line]
    assert len(said) == 1 and "more than 2 h ago (T2T_LOCK_STALE_HOURS)" in said[0]
    assert len(stub_run) == 1


# ------------------------------------------------------------------ a full disk
NO_SPACE = [OSError(errno.ENOSPC, "No space left on device"),
            ValueError("RESOURCE_EXHAUSTED: Error writing local file \"/ck/4/d/x\": "
                       "[OS error 28: No space left on device]")]


def _fill_the_disk(ckpt, error, monkeypatch):
    def save(*args, **kwargs):
        raise error
    monkeypatch.setattr(ckpt._manager, "save", save)


@pytest.mark.parametrize("error", NO_SPACE, ids=["ENOSPC", "orbax"])
def test_a_full_disk_names_the_directory_the_lost_step_and_the_intact_one(
        tmp_path, monkeypatch, error):
    _tiny_checkpoints(tmp_path / "ck", steps=(2,))
    tree = {"w": np.zeros((3, 4), np.float32)}
    with Checkpointer(str(tmp_path / "ck"), async_save=False) as ckpt:
        _fill_the_disk(ckpt, error, monkeypatch)
        with pytest.raises(DiskFullError) as full:
            ckpt.save(4, tree, {"epoch": 4}, "A = 1")
    assert full.value.summary == (
        f"no space left on the device of {tmp_path / 'ck'}: step 4 was not saved and the "
        "newest intact checkpoint is step 2; free space (or keep fewer checkpoints), then "
        "run the same command to resume")
    assert full.value.__cause__ is error


def test_an_async_save_that_fills_the_disk_is_reported_when_it_is_waited_for(
        tmp_path, monkeypatch):
    tree = {"w": np.zeros((3, 4), np.float32)}
    with Checkpointer(str(tmp_path / "ck")) as ckpt:
        monkeypatch.setattr(ckpt._manager, "save", lambda *args, **kwargs: True)
        ckpt.save(3, tree)                         # started; its error comes later

        def wait_until_finished():
            raise NO_SPACE[0]
        monkeypatch.setattr(ckpt._manager, "wait_until_finished", wait_until_finished)
        with pytest.raises(DiskFullError, match="step 3 was not saved and no checkpoint is "
                                                "intact yet"):
            ckpt.wait()
        monkeypatch.undo()


def test_other_save_errors_are_not_a_full_disk(tmp_path, monkeypatch):
    out_of_memory = ValueError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
    with Checkpointer(str(tmp_path / "ck"), async_save=False) as ckpt:
        _fill_the_disk(ckpt, out_of_memory, monkeypatch)
        with pytest.raises(ValueError) as raised:
            ckpt.save(1, {"w": np.zeros(2, np.float32)})
    assert raised.value is out_of_memory


def test_a_full_disk_in_a_run_is_one_line_and_exit_74(tmp_path, monkeypatch, capsys):
    from t2t.run import experiment

    def run():
        ckpt = Checkpointer(os.path.join(gin_utils.query_macro("MODEL_DIR"), "checkpoints"),
                            async_save=False)
        _fill_the_disk(ckpt, NO_SPACE[1], monkeypatch)
        ckpt.save(5, {"w": np.zeros(2, np.float32)})

    monkeypatch.setattr(experiment, "run", run)
    assert main(_train_argv(tmp_path / "run")) == EXIT_DISK_FULL == 74
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"t2t train: error: no space left on the device of "
                          f"{tmp_path / 'run' / 'checkpoints'}: step 5 was not saved and no "
                          "checkpoint is intact yet;"), err
    assert not (tmp_path / "run" / run_lock.LOCK_NAME).exists()


def test_finetune_holds_the_lock_too(tmp_path, monkeypatch, capsys):
    from t2t.run import finetune
    held = []

    def run(splits):
        held.append((tmp_path / "run" / run_lock.LOCK_NAME).exists())
        return {"result": types.SimpleNamespace(stopped_by="done")}

    monkeypatch.setattr(finetune, "run", run)
    argv = ["finetune", "--gin_file=experiments/finetune_t5_tiny_bible_en_es.gin",
            f"--gin.MODEL_DIR={tmp_path / 'run'}", f"--gin.INITIAL_CHECKPOINT={tmp_path}"]
    _lock(tmp_path / "run")
    assert main(argv) == 2 and "is in use by pid" in capsys.readouterr().err
    (tmp_path / "run" / run_lock.LOCK_NAME).unlink()
    assert main(argv) == 0 and held == [True]
    assert not (tmp_path / "run" / run_lock.LOCK_NAME).exists()


def test_orbax_tracebacks_of_a_failed_write_stay_off_the_terminal():
    """orbax logs each failed background write with its traceback before the error reaches
    the run: without --verbose those records are dropped (the error is reported in one line);
    the unraisable "Event loop is closed" errors that follow are dropped too."""
    from t2t import cli

    def record(filename):
        namespace = {}
        exec(compile("def fail():\n    raise ValueError('RESOURCE_EXHAUSTED')\n", filename,
                     "exec"), namespace)
        try:
            namespace["fail"]()
        except ValueError:
            exc_info = sys.exc_info()
        return logging.LogRecord("absl", logging.ERROR, __file__, 1, "failed", (), exc_info)

    assert not cli._quiet_orbax_failures(record(f"{os.sep}x{os.sep}orbax{os.sep}future.py"))
    assert cli._quiet_orbax_failures(record(f"{os.sep}x{os.sep}elsewhere.py"))
    assert cli._quiet_orbax_failures(logging.LogRecord("absl", logging.ERROR, __file__, 1,
                                                       "no traceback", (), None))
    seen = []
    previous = sys.unraisablehook
    sys.unraisablehook = seen.append
    try:
        cli._quiet_closed_event_loops()
        cli._quiet_closed_event_loops()                   # installed once
        for error in (RuntimeError("Event loop is closed"), RuntimeError("other")):
            sys.unraisablehook(types.SimpleNamespace(exc_value=error))
    finally:
        sys.unraisablehook = previous
    assert [str(u.exc_value) for u in seen] == ["other"]
