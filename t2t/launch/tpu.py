"""Run one command on a Cloud TPU slice until it finishes, through preemptions.

    create the queued resource ─► wait for ACTIVE ─► copy + install t2t on every worker
        ─► start the command on all workers ─► stream worker 0's log
        ─► exit 0: done  · exit 75 (preempted, checkpoint saved): start it again
        ─► slice lost (SUSPENDED, PREEMPTED, …): delete, re-create, install, start again

t2t resumes from MODEL_DIR's last checkpoint, so MODEL_DIR must outlive the slice (gs://).
Every gcloud call goes through a `Runner`: `Shell` prints and runs it, `DryRun` prints it.
"""
from __future__ import annotations

import pathlib
import re
import shlex
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, List, Mapping, Optional, Sequence, TextIO

from t2t.errors import EXIT_PREEMPTED
from t2t.launch import remote, source
from t2t.launch.gcloud import ACTIVE, LOST, WAITING, LaunchError, Slice

MEGASCALE_PORT = "8081"   # DCN coordination port on slice 0's worker 0
# What `Launcher.env` sets on every worker; `--env` may not override them.
OWN_ENV = ("TPU_NAME", "MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_PORT",
           "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")   # a POSIX shell variable name


def check_env_name(name: str, item: Optional[str] = None) -> None:
    """A LaunchError unless `name` (from the `--env` `item`) is a shell variable name: it goes
    into the remote `export NAME=...` unquoted."""
    if not _ENV_NAME.match(name):
        raise LaunchError(f"--env {item if item is not None else name!r}: expected NAME=VALUE "
                          "or NAME, NAME of letters, digits and '_', not starting with a digit")


class Runner:
    """Runs argv lists. `call` streams output and returns the exit code; `output` returns
    stdout (None when the command failed)."""

    def call(self, argv: List[str]) -> int:
        raise NotImplementedError

    def output(self, argv: List[str]) -> Optional[str]:
        raise NotImplementedError

    def call_all(self, argvs: Sequence[List[str]]) -> List[int]:
        """Run `argvs` at once (one per slice); their exit codes."""
        with ThreadPoolExecutor(max_workers=max(1, len(argvs))) as pool:
            return list(pool.map(self.call, argvs))


class Shell(Runner):
    """Prints each call (`+ shlex.join(argv)`) to `log`, then runs it."""

    def __init__(self, log: Optional[TextIO] = None):
        self.log = log or sys.stderr

    def _show(self, argv: List[str]) -> None:
        print(f"+ {shlex.join(argv)}", file=self.log, flush=True)

    def call(self, argv: List[str]) -> int:
        self._show(argv)
        return subprocess.run(argv).returncode

    def output(self, argv: List[str]) -> Optional[str]:
        self._show(argv)
        done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        return done.stdout.strip() if done.returncode == 0 else None


class DryRun(Runner):
    """Prints each call as one shell-quoted line on stdout; runs nothing. Queries answer as
    a fresh, healthy job would (no queued resource until it is created, then ACTIVE; the
    command exits 0), so the whole sequence is printed once."""

    def __init__(self, out: Optional[TextIO] = None, placeholder_ip: str = "IP_OF_WORKER_0"):
        self.out, self.placeholder_ip = out or sys.stdout, placeholder_ip
        self.created = False

    def call(self, argv: List[str]) -> int:
        print(shlex.join(argv), file=self.out, flush=True)
        self.created = self.created or argv[3:5] == ["queued-resources", "create"]
        return 0

    def call_all(self, argvs: Sequence[List[str]]) -> List[int]:
        return [self.call(a) for a in argvs]          # in order, for a readable listing

    def output(self, argv: List[str]) -> Optional[str]:
        self.call(argv)
        if "--format=value(state.state)" in argv:
            return ACTIVE if self.created else None
        if any(a.startswith("--format=value(networkEndpoints") for a in argv):
            return self.placeholder_ip
        return "0"                                    # the command's exit status


class Launcher:
    """The create / install / run / recover loop for `command` on `slice_`."""

    STATE_RETRIES = 3      # describe calls that may fail before the slice counts as gone

    def __init__(self, slice_: Slice, command: Sequence[str], runner: Runner,
                 checkout: Optional[pathlib.Path] = None, poll_seconds: float = 30.0,
                 max_restarts: int = 100, say: Callable[[str], None] = None,
                 env: Optional[Mapping[str, str]] = None):
        if not command:
            raise LaunchError("no command to run: put it after `--`, e.g. "
                              "t2t launch tpu ... -- t2t train --gin_file=...")
        self.slice, self.command, self.runner = slice_, list(command), runner
        self.user_env = dict(env or {})
        for name in self.user_env:
            check_env_name(name)
            if name in OWN_ENV:
                raise LaunchError(f"--env {name}: t2t launch sets it on every worker itself")
        self.checkout, self.poll_seconds, self.max_restarts = checkout, poll_seconds, max_restarts
        self.dry_run = isinstance(runner, DryRun)
        self.say = say or (lambda msg: None if self.dry_run else
                           print(f"[t2t launch] {msg}", file=sys.stderr, flush=True))
        if not self.dry_run:
            source.check(checkout)

    # --------------------------------------------------------------------------- the slice
    def state(self) -> Optional[str]:
        """The queued resource's state; None when it does not exist."""
        return self.runner.output(self.slice.state())

    def _check(self, codes: Sequence[int], what: str) -> None:
        """A LaunchError if any of the calls' exit `codes` is not 0."""
        bad = [c for c in codes if c != 0]
        if bad:
            raise LaunchError(f"{what} failed (gcloud exit {bad[0]}); see gcloud's message "
                              "above")

    def acquire(self) -> None:
        """Make the queued resource exist and be ACTIVE (re-created if it was lost)."""
        state = self.state()
        if state in LOST:
            self.say(f"{self.slice.name} is {state}: deleting it to create it again")
            self._check([self.runner.call(self.slice.delete())], "deleting the queued resource")
            state = None
        if state is None:
            self.say(f"creating the queued resource {self.slice.name} (a NOT_FOUND above just "
                     "means it did not exist yet)")
            self._check([self.runner.call(self.slice.create())], "creating the queued resource")
        while state != ACTIVE:
            state = self.state()
            if state in LOST:
                raise LaunchError(f"{self.slice.name} went {state} before it became ACTIVE; "
                                  "try another zone, --reserved, or later")
            if state != ACTIVE:
                self.say(f"{self.slice.name}: {state or 'not visible yet'}; waiting "
                         f"(states {', '.join(WAITING)} come first)")
                time.sleep(self.poll_seconds)

    def install(self) -> None:
        """Copy the packed checkout to every worker of every slice and install it."""
        archive = pathlib.Path(tempfile.gettempdir()) / f"t2t-launch-{self.slice.name}" / \
            remote.ARCHIVE
        if not self.dry_run:
            source.pack(self.checkout, archive)
        try:
            codes = self.runner.call_all([self.slice.scp(n, str(archive), remote.ARCHIVE)
                                          for n in self.slice.nodes])
        finally:
            archive.unlink(missing_ok=True)
        self._check(codes, "copying the checkout to the workers")
        codes = self.runner.call_all([self.slice.ssh(n, remote.setup())
                                      for n in self.slice.nodes])
        self._check(codes, "installing t2t on the workers")

    # --------------------------------------------------------------------------- the job
    def env(self, slice_id: int, coordinator: Optional[str]) -> dict:
        """Environment of the command on slice `slice_id`: the user's `--env` variables, the
        node name, and for several slices the MEGASCALE variables through which JAX and libtpu
        join them over DCN."""
        env = {**self.user_env, "TPU_NAME": self.slice.nodes[slice_id]}
        if self.slice.num_slices > 1:
            env.update(MEGASCALE_COORDINATOR_ADDRESS=f"{coordinator}:{MEGASCALE_PORT}",
                       MEGASCALE_PORT=MEGASCALE_PORT,
                       MEGASCALE_NUM_SLICES=str(self.slice.num_slices),
                       MEGASCALE_SLICE_ID=str(slice_id))
        return env

    def start(self) -> None:
        """Start the command, detached, on every worker of every slice."""
        coordinator = None
        if self.slice.num_slices > 1:
            coordinator = self.runner.output(self.slice.node_ip(self.slice.nodes[0]))
            if not coordinator:
                raise LaunchError(f"could not read the IP of {self.slice.nodes[0]} worker 0")
        codes = self.runner.call_all([
            self.slice.ssh(node, remote.start(self.command, self.env(i, coordinator)))
            for i, node in enumerate(self.slice.nodes)])
        self._check(codes, "starting the command on the workers")

    def follow(self) -> Optional[int]:
        """Stream worker 0's log until the command ends; its exit status, or None when the
        slice was lost meanwhile. A dropped connection while it runs re-attaches."""
        node0 = self.slice.nodes[0]
        while True:
            self.runner.call(self.slice.ssh(node0, remote.follow(), worker="0"))
            state = self.state()
            for _ in range(self.STATE_RETRIES):   # a failed describe is not a lost slice
                if state is not None:
                    break
                time.sleep(self.poll_seconds)
                state = self.state()
            if state != ACTIVE:
                self.say(f"{self.slice.name} is {state or 'gone'}: the slice was lost")
                return None
            status = self.runner.output(self.slice.ssh(node0, remote.exit_code(), worker="0"))
            if status is not None and status.isdigit():
                return int(status)
            if status == remote.NOT_STARTED:
                raise LaunchError(f"the command never started on {node0} worker 0; see "
                                  f"t2t launch logs --name {self.slice.name} --zone "
                                  f"{self.slice.zone}")
            self.say(f"lost the log stream (worker 0 says {status!r}); re-attaching")
            time.sleep(self.poll_seconds)

    def run(self) -> int:
        """The whole job; returns the command's exit status (0 when it finished)."""
        restarts = 0
        self.acquire()
        self.install()
        while True:
            self.start()
            code = self.follow()
            if code == 0:
                self.say(f"done; the slice is still up: t2t launch delete --name "
                         f"{self.slice.name} --zone {self.slice.zone}")
                return 0
            if code not in (None, EXIT_PREEMPTED):
                self.say(f"the command failed on worker 0 with exit {code}; slice kept for "
                         f"`t2t launch logs`")
                return code
            restarts += 1
            if restarts > self.max_restarts:
                self.say(f"giving up after {self.max_restarts} restarts")
                return EXIT_PREEMPTED
            if code is None:                   # the slice is gone: a new one, a new install
                self.acquire()
                self.install()
            else:
                self.say("the command was preempted (exit 75, checkpoint saved); "
                         f"restarting it (restart {restarts})")
