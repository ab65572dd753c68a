"""Execute the notebooks: each NAME.py (jupytext percent format, the source) becomes
NAME.ipynb with its outputs, run by this Python's ipykernel.

    .venv/bin/python notebooks/execute.py                  # all, CI settings, writes .ipynb
    .venv/bin/python notebooks/execute.py quickstart --full

`tests/test_notebooks.py` runs the same `execute` in a temporary directory.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ("quickstart", "pretrain_t5", "sharding", "ablation_results")
KERNEL = "t2t-python"
# The test process's 8 fake devices and plotting backend must not leak into a kernel: a
# notebook runs as a user's would (the sharding notebook sets its own devices).
DROPPED = ("XLA_FLAGS", "MPLBACKEND", "JPY_PARENT_PID")


def source(name: str) -> nbformat.NotebookNode:
    """The notebook as its .py file describes it (no outputs)."""
    return jupytext.read(HERE / f"{name}.py")


def cell_sources(nb: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """(cell type, source) of every cell: what must agree between the .py and the .ipynb."""
    return [(cell.cell_type, cell.source) for cell in nb.cells]


def kernel_env(ci: bool) -> dict[str, str]:
    """This process's environment for the kernel, with the persistent compilation cache
    (as tests/conftest.py) and `T2T_NOTEBOOK_CI=1` for the tiny settings."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["JAX_COMPILATION_CACHE_DIR"] = env.get(
        "T2T_JAX_CACHE", os.path.expanduser("~/.cache/t2t/jax_cache"))
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if ci:
        env["T2T_NOTEBOOK_CI"] = "1"
    else:
        env.pop("T2T_NOTEBOOK_CI", None)
    return env


def _kernel_manager(spec_dir: Path) -> KernelManager:
    """A kernel of this very interpreter (`sys.executable`), whatever kernels are installed."""
    (spec_dir / KERNEL).mkdir(parents=True)
    (spec_dir / KERNEL / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (t2t)", "language": "python"}))
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir)], ensure_native_kernel=False)
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs, transport="ipc",
                         ip=str(spec_dir / "kernel"))


def execute(name: str, *, ci: bool = True, cwd: str | Path | None = None,
            timeout: int = 600) -> nbformat.NotebookNode:
    """Run every cell of notebook `name` in `cwd` (default: notebooks/); a cell that raises
    raises `nbclient.exceptions.CellExecutionError` naming it."""
    nb = source(name)
    with tempfile.TemporaryDirectory() as specs:
        client = NotebookClient(nb, km=_kernel_manager(Path(specs)), timeout=timeout,
                                resources={"metadata": {"path": str(cwd or HERE)}})
        client.execute(env=kernel_env(ci))
    nb.metadata.pop("widgets", None)
    return nb


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"some of {', '.join(NOTEBOOKS)} (default: all)")
    parser.add_argument("--full", action="store_true",
                        help="the notebooks' larger settings instead of the CI ones")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"no notebook {', '.join(unknown)}; choose from {', '.join(NOTEBOOKS)}")
    for name in args.names or NOTEBOOKS:
        start = time.perf_counter()
        nb = execute(name, ci=not args.full)
        nbformat.write(nb, HERE / f"{name}.ipynb")
        print(f"{name}.ipynb: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
