"""Errors caused by what the person running t2t gave it (a config, a checkpoint, a file).

The command line prints such an error's `summary` as one line, with no traceback (that goes
to a log file, or to the terminal with `--verbose`); Python callers get the whole message.
"""
from __future__ import annotations

# `t2t train` / `t2t finetune` exit with this code when SIGTERM or Ctrl-C stopped the run
# after saving a checkpoint: "preempted, run the same command again to resume" (EX_TEMPFAIL).
EXIT_PREEMPTED = 75
# Bad input (config, checkpoint, file, argument), reported in one line.
EXIT_USAGE = 2
# `t2t train` / `t2t finetune`: the disk (or bucket) filled up while a checkpoint was being
# saved; one line names the directory, the step not saved and the newest intact step
# (EX_IOERR). Free space and run the same command again to resume from the intact step.
EXIT_DISK_FULL = 74
# Anything else that went wrong (a bug in t2t or a library it uses): one line on stderr,
# `t2t COMMAND: error: internal error: TYPE: message`, the traceback in the error log.
EXIT_INTERNAL = 1


class UserError(Exception):
    """Bad input: `summary` says in one line what is wrong and what to do; `details` is the
    longer story (every mismatching parameter, say) for the log."""

    def __init__(self, summary: str, details: str = ""):
        super().__init__(summary)
        self.summary, self.details = summary, details

    def __str__(self) -> str:
        return f"{self.summary}\n{self.details}" if self.details else self.summary


class ConfigError(UserError, ValueError):
    """A gin config or command-line binding that cannot work (unused, missing, inconsistent)."""


class CheckpointMismatchError(UserError, ValueError):
    """A checkpoint whose parameter tree does not fit the model it is restored into."""


class InputFileError(UserError, ValueError):
    """A user-supplied input file that cannot be read as asked (encoding, emptiness)."""


class DiskFullError(UserError):
    """No space left where a checkpoint was being written (exit EXIT_DISK_FULL, not 2)."""
