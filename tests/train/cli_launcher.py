"""Runs `t2t` in a subprocess that signals itself after a given step: the resume and
interrupt tests' launcher.

SIGNAL_AFTER=k and SIGNAL=NAME send NAME once k steps have finished; WAIT_FOR_CHECKPOINT=s
first waits until the (async) checkpoint of step s has been committed. The child handles
Ctrl-C as a process started at a terminal does, whatever the suite's own SIGINT setting."""
import subprocess
import sys

from tests.jax_setup import cpu_env

LAUNCHER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, even if the
import jax                                                # suite runs with SIGINT ignored
from t2t.train import trainer
after = int(os.environ.get("SIGNAL_AFTER", "0"))
if after:
    original, done = trainer.Trainer.train_step, [0]
    def train_step(self, state, batch):
        out = original(self, state, batch)
        jax.block_until_ready(out)
        done[0] += 1
        if done[0] == after:
            wait_for = os.environ.get("WAIT_FOR_CHECKPOINT")
            if wait_for:
                committed = os.path.join(self.config.model_dir, "checkpoints", wait_for)
                deadline = time.time() + 120
                while not os.path.isdir(committed) and time.time() < deadline:
                    time.sleep(0.05)
            os.kill(os.getpid(), getattr(signal, os.environ["SIGNAL"]))
        return out
    trainer.Trainer.train_step = train_step
from t2t.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_t2t(argv, **env) -> subprocess.CompletedProcess:
    """`t2t *argv` on the CPU with the tests' compilation cache; `env` as described above."""
    full_env = cpu_env(**{k: str(v) for k, v in env.items()})
    return subprocess.run([sys.executable, "-c", LAUNCHER, *argv], env=full_env,
                          capture_output=True, text=True, timeout=600)
