"""`t2t launch` against a fake `gcloud` on PATH (tests/launch/fake_gcloud.py): no network.

The fake runs each ssh command with bash for real in per-worker home directories, so these
tests check the remote shell scripts themselves, quoting included."""
import io
import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

from t2t.launch import cli, remote
from t2t.launch.gcloud import LaunchError, Slice, accelerator_type
from t2t.launch.tpu import DryRun, Launcher

FAKE = pathlib.Path(__file__).with_name("fake_gcloud.py")
# Values a run name or gin binding may hold that a shell would otherwise act on.
HOSTILE = ["--gin.RUN_NAME=it's a \"run\"; touch HACKED_1",
           "--gin.NOTE=$(touch HACKED_2) `touch HACKED_3` & touch HACKED_4 | cat",
           "--gin.EMPTY=", "two words\ttab"]
# A stand-in for `t2t train`, shipped in the checkout: it records how it was called and
# exits as $BUCKET/schedule.json says for its n-th run on this slice.
FAKE_TRAINER = """
import json, os, sys
bucket = sys.argv[1]
with open(os.path.join(bucket, "runs.jsonl"), "a") as f:
    f.write(json.dumps({"argv": sys.argv[2:], "cwd": os.getcwd(),
                        "env": {k: v for k, v in os.environ.items()
                                if k.startswith(("MEGASCALE", "TPU_NAME", "T2T_NOTE"))}}) + "\\n")
runs = [json.loads(line) for line in open(os.path.join(bucket, "runs.jsonl"))]
mine = [r for r in runs if r["env"]["TPU_NAME"] == os.environ["TPU_NAME"]]
code = json.load(open(os.path.join(bucket, "schedule.json")))[(len(mine) - 1) // %d]
print(f"step 1 loss 9.5 on {os.environ['TPU_NAME']}, exiting {code}")
sys.exit(code)
"""


def _fake_cloud(tmp_path, monkeypatch, script, schedule, workers=1):
    """PATH gets a `gcloud` running the fake; returns (fake's dir, checkout, bucket)."""
    state, bin_dir, checkout, bucket = (tmp_path / d for d in ("gcloud", "bin", "src", "bucket"))
    for d in (state, bin_dir, checkout, bucket):
        d.mkdir()
    (bin_dir / "gcloud").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    (bin_dir / "gcloud").chmod(0o755)
    (state / "script.json").write_text(json.dumps(script))
    (bucket / "schedule.json").write_text(json.dumps(schedule))
    (checkout / "pyproject.toml").write_text("[project]\nname = \"t2t\"\n")
    (checkout / "fake_t2t.py").write_text(FAKE_TRAINER % workers)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_GCLOUD", str(state))
    monkeypatch.setenv("FAKE_WORKERS", str(workers))
    return state, checkout, bucket


def _calls(state):
    """The fake's calls, each its argv after `gcloud`."""
    path = state / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _verbs(calls):
    """Each call as its verb, ssh calls as `ssh:` plus which remote script they ran."""
    out = []
    for argv in calls:
        command = next((a.split("=", 1)[1] for a in argv if a.startswith("--command=")), "")
        kind = {remote.setup(): "setup", remote.follow(): "follow",
                remote.exit_code(): "exit_code"}.get(command, "start" if "nohup" in command
                                                      else "")
        out.append(f"{argv[3]}{':' + kind if kind else ''}")
    return out


def test_preempted_slices_are_recreated_and_the_command_rerun(tmp_path, monkeypatch, capfd):
    # Slice life: CREATING -> ACTIVE; run 1 exits 75 (SIGTERM, checkpoint saved) and is
    # restarted in place; run 2 dies with the slice (PREEMPTED) -> delete, create, install,
    # run 3 exits 0. Two slices of two workers: every run starts on 4 workers.
    state, checkout, bucket = _fake_cloud(
        tmp_path, monkeypatch, script=[["CREATING", "ACTIVE", "ACTIVE", "PREEMPTED"],
                                       ["CREATING", "ACTIVE"]],
        schedule=[75, 1, 0], workers=2)
    command = ["python3", "fake_t2t.py", str(bucket)] + HOSTILE
    code = cli.main(["tpu", "--name", "job", "--zone", "z-1", "--accelerator", "v5e-16",
                     "--num_slices", "2", "--spot", "--project", "p", f"--source={checkout}",
                     "--poll_seconds", "0", "--env", f"T2T_NOTE={HOSTILE[1]}", "--"] + command)
    out, err = capfd.readouterr()
    assert code == 0, err

    calls = _calls(state)
    assert _verbs(calls) == (
        ["describe", "create", "describe", "describe", "scp", "scp", "ssh:setup", "ssh:setup"]
        + ["describe", "ssh:start", "ssh:start", "ssh:follow", "describe", "ssh:exit_code"]
        + ["describe", "ssh:start", "ssh:start", "ssh:follow", "describe"]        # lost
        + ["describe", "delete", "create", "describe", "describe", "scp", "scp",
           "ssh:setup", "ssh:setup"]
        + ["describe", "ssh:start", "ssh:start", "ssh:follow", "describe", "ssh:exit_code"])
    creates = [c for c in calls if c[3] == "create"]
    assert creates[0] == creates[1] == [
        "compute", "tpus", "queued-resources", "create", "job", "--node-count=2",
        "--node-prefix=job", "--zone=z-1", "--project=p", "--accelerator-type=v5litepod-16",
        "--runtime-version=v2-alpha-tpuv5-lite", "--spot"]

    runs = [json.loads(line) for line in (bucket / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 3 * 2 * 2                      # 3 runs x 2 slices x 2 workers
    assert all(r["argv"] == HOSTILE for r in runs)     # byte-exact, nothing interpreted
    assert {(r["env"]["TPU_NAME"], r["env"]["MEGASCALE_SLICE_ID"]) for r in runs} == {
        ("job-0", "0"), ("job-1", "1")}
    assert {r["env"]["MEGASCALE_COORDINATOR_ADDRESS"] for r in runs} == {"10.0.0.0:8081"}
    assert {r["env"]["MEGASCALE_NUM_SLICES"] for r in runs} == {"2"}
    assert {r["env"]["T2T_NOTE"] for r in runs} == {HOSTILE[1]}      # --env, as text
    assert not list(tmp_path.rglob("HACKED*"))
    # Worker 0's log reached our stdout, once per run; every gcloud call was shown first.
    assert out.count("on job-0, exiting") == 3 and "on job-1" not in out
    assert err.count("+ gcloud ") == len(calls)


def test_failed_command_keeps_the_slice_and_returns_its_exit_code(tmp_path, monkeypatch,
                                                                  capfd):
    state, checkout, bucket = _fake_cloud(tmp_path, monkeypatch, script=[["ACTIVE"]],
                                          schedule=[3])
    code = cli.main(["tpu", "--name", "job", "--zone", "z", "--accelerator", "v4-8",
                     f"--source={checkout}", "--poll_seconds", "0", "--",
                     "python3", "fake_t2t.py", str(bucket)])
    assert code == 3
    verbs = _verbs(_calls(state))
    assert "delete" not in verbs and verbs.count("ssh:start") == 1
    create = _calls(state)[1]
    assert "--node-id=job" in create and "--runtime-version=tpu-ubuntu2204-base" in create
    assert "exit 3" in capfd.readouterr().err


def test_dry_run_prints_the_whole_two_slice_sequence_and_runs_nothing(tmp_path, monkeypatch,
                                                                      capfd):
    state, _, _ = _fake_cloud(tmp_path, monkeypatch, script=[["ACTIVE"]], schedule=[0])
    command = ["t2t", "train", "--gin_file=experiments/t5_1_1_base.gin"] + HOSTILE
    code = cli.main(["tpu", "--name", "t5-base", "--zone", "us-west4-a", "--accelerator",
                     "v5e-256", "--num_slices", "2", "--reserved", "--dry-run", "--"] + command)
    out, _ = capfd.readouterr()
    assert code == 0 and not (state / "calls.jsonl").exists()
    lines = [shlex.split(line) for line in out.splitlines()]
    assert all(argv[0] == "gcloud" for argv in lines)            # nothing else on stdout
    verbs = [" ".join(argv[3:5]) for argv in lines]
    assert verbs == ["queued-resources describe", "queued-resources create",
                     "queued-resources describe", "tpu-vm scp", "tpu-vm scp", "tpu-vm ssh",
                     "tpu-vm ssh", "tpu-vm describe", "tpu-vm ssh", "tpu-vm ssh", "tpu-vm ssh",
                     "queued-resources describe", "tpu-vm ssh"]
    assert lines[1][6:] == ["--node-count=2", "--node-prefix=t5-base", "--zone=us-west4-a",
                            "--accelerator-type=v5litepod-256",
                            "--runtime-version=v2-alpha-tpuv5-lite", "--reserved"]
    starts = [argv[-1] for argv in lines if "nohup" in argv[-1]]
    assert len(starts) == 2
    for slice_id, start in enumerate(starts):
        # Undo the two remote shell levels: the worker's login shell, then `bash -c`.
        outer = _shell_words(start.split("=", 1)[1])
        job = _shell_words(outer[outer.index("-c") + 1])
        assert f"MEGASCALE_SLICE_ID={slice_id}" in job
        at = job.index(command[0])
        assert job[at:at + len(command) + 1] == command + [";"]


def _job_words(dry_run_out):
    """The `bash -c` job of each start call in a dry run's stdout, as shell words."""
    starts = [shlex.split(line)[-1] for line in dry_run_out.splitlines() if "nohup" in line]
    outer = [_shell_words(start.split("=", 1)[1]) for start in starts]
    return [_shell_words(words[words.index("-c") + 1]) for words in outer]


def test_env_and_local_libtpu_init_args_reach_every_worker(monkeypatch, capfd):
    fix = "--xla_jf_conv_input_fusion=false"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", fix)
    monkeypatch.setenv("T2T_BUCKET", "gs://b/it's here")
    base = ["tpu", "--name", "j", "--zone", "z", "--accelerator", "v5e-256", "--num_slices",
            "2", "--dry-run", "--env", "TFDS_DATA_DIR=gs://b/tfds; touch HACKED", "--env",
            "T2T_BUCKET", "--env", "EMPTY="]
    assert cli.main(base + ["--", "t2t", "train"]) == 0
    out, err = capfd.readouterr()
    jobs = _job_words(out)
    assert len(jobs) == 2
    for slice_id, job in enumerate(jobs):
        for var in ["TFDS_DATA_DIR=gs://b/tfds; touch HACKED", "T2T_BUCKET=gs://b/it's here",
                    "EMPTY=", f"LIBTPU_INIT_ARGS={fix}", f"TPU_NAME=j-{slice_id}",
                    f"MEGASCALE_SLICE_ID={slice_id}"]:
            assert job[job.index(var) - 1:job.index(var) + 2] == ["export", var, ";"]
    forwarded = [line for line in err.splitlines() if "LIBTPU_INIT_ARGS" in line]
    assert len(forwarded) == 1 and "forwarding LIBTPU_INIT_ARGS=" in forwarded[0]
    # An explicit --env wins over the local value, silently.
    assert cli.main(base + ["--env", "LIBTPU_INIT_ARGS=", "--", "t2t", "train"]) == 0
    out, err = capfd.readouterr()
    assert all("LIBTPU_INIT_ARGS=" in job and f"LIBTPU_INIT_ARGS={fix}" not in job
               for job in _job_words(out))
    assert "forwarding" not in err
    # Without it locally, nothing is forwarded.
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    assert cli.main(base + ["--", "t2t", "train"]) == 0
    assert not any(w.startswith("LIBTPU_INIT_ARGS") for job in _job_words(capfd.readouterr().out)
                   for w in job)


def _shell_words(text):
    """Words and control operators (`;`, `&`, ...) as a POSIX shell splits `text`."""
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


@pytest.mark.parametrize("argv, message", [
    (["--accelerator", "v9-8"], "--accelerator 'v9-8'"),
    (["--accelerator", "v5e"], "expected FAMILY-SIZE"),
    (["--accelerator", "v5e-8", "--name", "Bad_Name"], "--name 'Bad_Name'"),
    (["--accelerator", "v5e-8", "--num_slices", "0"], "--num_slices must be >= 1"),
    (["--accelerator", "v5e-8", "--env", "=x"], "--env '=x': expected NAME=VALUE or NAME"),
    (["--accelerator", "v5e-8", "--env", "A-B=x"], "--env 'A-B=x': expected NAME=VALUE"),
    (["--accelerator", "v5e-8", "--env", "X=1", "--env", "1X"], "--env '1X': expected"),
    (["--accelerator", "v5e-8", "--env", "T2T_UNSET_HERE"],
     "--env T2T_UNSET_HERE: not set in this shell"),
    (["--accelerator", "v5e-8", "--env", "TPU_NAME=x"], "--env TPU_NAME: t2t launch sets it"),
])
def test_bad_arguments_are_one_line_before_any_gcloud_call(tmp_path, monkeypatch, capfd,
                                                          argv, message):
    state, _, _ = _fake_cloud(tmp_path, monkeypatch, script=[["ACTIVE"]], schedule=[0])
    monkeypatch.delenv("T2T_UNSET_HERE", raising=False)
    base = ["tpu", "--name", "job", "--zone", "z"]
    assert cli.main(base + argv + ["--", "t2t", "train"]) == 2
    err = capfd.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (state / "calls.jsonl").exists()


def test_missing_command_and_stray_command_are_refused(capfd):
    assert cli.main(["tpu", "--name", "j", "--zone", "z", "--accelerator", "v4-8",
                     "--dry-run"]) == 2
    assert "no command to run" in capfd.readouterr().err
    assert cli.main(["delete", "--name", "j", "--zone", "z", "--", "rm"]) == 2


def test_status_logs_delete(tmp_path, monkeypatch, capfd):
    state, _, _ = _fake_cloud(tmp_path, monkeypatch, script=[["ACTIVE"]], schedule=[0])
    assert cli.main(["delete", "--name", "j", "--zone", "z", "--dry-run"]) == 0
    assert capfd.readouterr().out.split() == [
        "gcloud", "compute", "tpus", "queued-resources", "delete", "j", "--zone=z", "--force",
        "--quiet"]
    # A live slice whose worker 0 ran a command that exited 0.
    (state / "script.json").write_text(json.dumps([["ACTIVE"]]))
    assert cli.main(["delete", "--name", "j", "--zone", "z"]) == 1          # not there yet
    subprocess.run(["gcloud", "compute", "tpus", "queued-resources", "create", "j",
                    "--node-id=j", "--zone=z"], check=True)
    launch_dir = state / "vms" / "j" / "w0" / "t2t" / ".launch"
    launch_dir.mkdir(parents=True)
    (launch_dir / "log").write_text("step 7 loss 3.2\n")
    (launch_dir / "pid").write_text("999999\n")
    capfd.readouterr()
    assert cli.main(["status", "--name", "j", "--zone", "z"]) == 0
    out = capfd.readouterr().out
    assert "state: ACTIVE" in out and "command on j worker 0: running" in out
    (launch_dir / "exit_code").write_text("0\n")
    assert cli.main(["status", "--name", "j", "--zone", "z"]) == 0
    assert "command on j worker 0: 0" in capfd.readouterr().out
    assert cli.main(["logs", "--name", "j", "--zone", "z"]) == 0
    assert capfd.readouterr().out == "step 7 loss 3.2\n"
    assert cli.main(["logs", "--name", "j", "--zone", "z", "--follow"]) == 0   # pid is gone
    assert capfd.readouterr().out == "step 7 loss 3.2\n"
    assert cli.main(["delete", "--name", "j", "--zone", "z"]) == 0
    assert _calls(state)[-1][3:] == ["delete", "j", "--zone=z", "--force", "--quiet"]


def test_accelerator_names():
    assert accelerator_type("v5e-256") == ("v5litepod-256", "v2-alpha-tpuv5-lite")
    assert accelerator_type("v5litepod-8") == ("v5litepod-8", "v2-alpha-tpuv5-lite")
    assert accelerator_type("v5p-128") == ("v5p-128", "v2-alpha-tpuv5")
    assert accelerator_type("v6e-64") == ("v6e-64", "v2-alpha-tpuv6e")
    with pytest.raises(LaunchError):
        Slice("j", "z", spot=True, reserved=True)


def test_a_command_that_never_started_is_an_error_not_an_endless_wait():
    class NeverStarted(DryRun):
        def output(self, argv):
            if argv[-1] == f"--command={remote.exit_code()}":
                return remote.NOT_STARTED
            return super().output(argv)

    launcher = Launcher(Slice("j", "z"), ["t2t", "train"], NeverStarted(out=io.StringIO()))
    with pytest.raises(LaunchError, match="never started on j worker 0"):
        launcher.run()
