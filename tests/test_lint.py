"""ruff (configured in pyproject.toml) finds nothing in the code, tests, benchmarks,
launchers and notebooks' sources: CI lints through this test."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    paths = [p for p in ("t2t", "tests", "benchmarks", "launch", "notebooks")
             if (ROOT / p).exists()]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *paths],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
