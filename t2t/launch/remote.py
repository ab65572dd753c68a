"""The shell scripts `t2t launch` runs on TPU VM workers.

Each is one string for `gcloud ... ssh --command`, parsed once by the worker's shell. Every
value from the user (the command, its gin bindings, environment values) goes in through
`shlex.quote`, so spaces, quotes or `;` in a run name never become shell syntax.

On a worker the job lives in ~/t2t (the unpacked checkout) and ~/t2t/.launch: `log` (the
command's output), `pid` (its process) and `exit_code` (written when it ends).
"""
from __future__ import annotations

import shlex
from typing import Mapping, Sequence

ARCHIVE = "t2t-src.tar.gz"   # the packed checkout, copied into each worker's $HOME
EXTRAS = "tpu,gcs"           # what the workers install: jax[tpu] and gs:// support
RUNNING = "running"          # what `exit_code()` prints while the command runs
NOT_STARTED = "not started"  # ... and when no command was started in ~/t2t


def setup(extras: str = EXTRAS) -> str:
    """Unpack the checkout into ~/t2t and install it (editable: configs/ stays beside it)."""
    return ("set -e; rm -rf ~/t2t; mkdir -p ~/t2t; "
            f"tar -xzf ~/{ARCHIVE} -C ~/t2t; cd ~/t2t; "
            f"python3 -m pip install --user --quiet --upgrade pip; "
            f"python3 -m pip install --user --quiet -e {shlex.quote(f'.[{extras}]')}")


def start(command: Sequence[str], env: Mapping[str, str]) -> str:
    """Start `command` in ~/t2t, detached (it outlives the ssh session), with `env` set;
    its exit status lands in .launch/exit_code."""
    exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())
    job = (f'export PATH="$HOME/.local/bin:$PATH"; export PYTHONUNBUFFERED=1; {exports}'
           f"{shlex.join(command)}; echo $? > ~/t2t/.launch/exit_code")
    return ("cd ~/t2t || exit 1; mkdir -p .launch; rm -f .launch/exit_code; "
            f"nohup bash -c {shlex.quote(job)} > .launch/log 2>&1 < /dev/null & "
            "echo $! > .launch/pid")


def follow() -> str:
    """Print the log from its start and follow it until the command ends."""
    return 'cd ~/t2t/.launch && tail -n +1 -F --pid="$(cat pid)" log'


def show_log() -> str:
    """Print the log as it is now."""
    return "cat ~/t2t/.launch/log"


def exit_code() -> str:
    """The command's exit status, `running`, or `not started`."""
    return (f"cd ~/t2t/.launch 2>/dev/null || {{ echo {NOT_STARTED}; exit 0; }}; "
            f"if [ -e exit_code ]; then cat exit_code; elif [ -e pid ]; then echo {RUNNING}; "
            f"else echo {NOT_STARTED}; fi")
