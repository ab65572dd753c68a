"""Ctrl-C and SIGTERM on `t2t train`: save, one line, exit 75 ("preempted, resume me"); the
rerun says where it resumed, metrics.jsonl keeps each step once, the summary compares step 1
with the last step, and a finished run says it is done."""
import json
import os
import signal

import pytest

from t2t.cli import main
from t2t.errors import EXIT_PREEMPTED
from t2t.train import curves
from t2t.train.metrics_log import MetricsLogger
from t2t.train.trainer import Trainer, _Preemption

TINY = ["--gin_file=experiments/t5_tiny_bible.gin", "--gin_file=models/t5/1_1/test.gin",
        "--gin.TRAIN_STEPS=6", "--gin.BATCH_SIZE=4",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 32, 'targets': 8}",
        "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.checkpoint_every=100",
        "--gin.TrainConfig.progress_bar=False"]


def signal_after(monkeypatch, signum, steps):
    """The run sends itself `signum` once `steps` train steps have run (then never again)."""
    original, done = Trainer.train_step, []

    def step_then_signal(self, state, batch):
        out = original(self, state, batch)
        done.append(1)
        if len(done) == steps:
            os.kill(os.getpid(), signum)
        return out

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)


def test_ctrl_c_saves_exits_75_and_the_rerun_resumes(tmp_path, monkeypatch, capsys,
                                                     sigint_handler):
    """As at a terminal: the first Ctrl-C saves after the step and exits 75; the same command
    resumes. (tests/train/test_resume.py kills a real subprocess; this runs in-process.)"""
    signal_after(monkeypatch, signal.SIGINT, 3)
    argv = ["train", *TINY, "--gin.BATCH_SIZE=8", f"--gin.MODEL_DIR={tmp_path}"]  # 8 devices
    assert main(argv) == EXIT_PREEMPTED
    stopped = capsys.readouterr().err
    assert "Traceback" not in stopped
    assert "SIGINT: saved step 3; run the same command to resume" in stopped
    assert os.listdir(tmp_path / "checkpoints") == ["3"]

    assert main(argv) == 0
    resumed = capsys.readouterr()
    assert f"resumed from step 3 ({tmp_path})" in resumed.err
    assert "Metadata file does not exist" not in resumed.err     # orbax's noise, silenced
    steps = [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3, 4, 5, 6]                   # step 4's replay is not a duplicate
    assert "loss" in resumed.out and " at step 1 -> " in resumed.out
    assert (tmp_path / "loss.png").read_bytes()[:4] == b"\x89PNG"


def test_sigterm_exits_75_and_a_finished_run_says_so(tmp_path, monkeypatch, capsys,
                                                     sigint_handler):
    signal_after(monkeypatch, signal.SIGTERM, 2)
    argv = ["train", *TINY, "--gin.BATCH_SIZE=8", f"--gin.MODEL_DIR={tmp_path}"]  # 8 devices
    assert main(argv) == EXIT_PREEMPTED
    assert os.listdir(tmp_path / "checkpoints") == ["2"]
    capsys.readouterr()
    assert main(argv + ["--gin.TRAIN_STEPS=2"]) == 0          # nothing left to train
    assert (f"already done: {tmp_path} is at step 2 of TRAIN_STEPS = 2"
            in capsys.readouterr().err)


@pytest.fixture
def sigint_handler():
    """SIGINT handled by Python's default handler and SIGTERM by the system's for the test,
    whatever the suite started with (a background job starts with SIGINT ignored), and put
    back after it."""
    before = {signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler),
              signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL)}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_second_ctrl_c_aborts_at_once(sigint_handler):
    def earlier(signum, frame):           # what the caller had: restored afterwards
        raise AssertionError("the caller's handler ran during the run")

    signal.signal(signal.SIGINT, earlier)
    with _Preemption() as preemption:
        signal.raise_signal(signal.SIGINT)
        assert preemption.requested == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is earlier


def test_a_signal_ignored_at_the_start_stays_ignored(sigint_handler):
    """Under nohup or a batch system that ignores SIGINT, Ctrl-C neither stops the run nor
    aborts it; SIGTERM, still handled, asks it to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with _Preemption() as preemption:
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        assert preemption.requested is None
        signal.raise_signal(signal.SIGTERM)
        assert preemption.requested == "SIGTERM"
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_resumed_logger_drops_the_rows_it_replays(tmp_path):
    with MetricsLogger(str(tmp_path), every_n=1, progress_bar=False, tensorboard=False) as log:
        for step in range(1, 6):
            log.log(step, {"loss": float(step)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "lo')                      # a row cut short by a kill
    with MetricsLogger(str(tmp_path), every_n=1, initial_step=3, progress_bar=False,
                       tensorboard=False) as log:
        log.log(4, {"loss": 40.0})
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_summary_reads_the_accuracies_each_family_logs(tmp_path):
    bert = [{"step": 1, "loss": 9.0, "mlm_accuracy": 0.0, "nsp_accuracy": 0.5},
            {"step": 2, "eval/loss": 8.0, "eval/mlm_accuracy": 0.01},
            {"step": 200, "loss": 6.0, "mlm_accuracy": 0.077, "nsp_accuracy": 0.61}]
    assert curves.summary_line(bert) == ("loss 9.000 at step 1 -> 6.000 at step 200 "
                                         "(mlm_accuracy 0.000 -> 0.077, nsp_accuracy 0.500 -> "
                                         "0.610)")
    t5 = [{"step": 1, "loss": 9.5, "accuracy": 0.0}, {"step": 9, "loss": 4.4, "accuracy": 0.3}]
    assert curves.summary_line(t5).endswith("(accuracy 0.000 -> 0.300)")
    png = curves.plot_metrics(bert, str(tmp_path / "loss.png"))
    assert open(png, "rb").read(4) == b"\x89PNG"
    assert curves.summary_line([]) is None and curves.plot_metrics([], "x.png") is None
