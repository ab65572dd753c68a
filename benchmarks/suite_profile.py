"""Where the test suite's time goes: per test, JAX's tracing, lowering and XLA compile seconds.

A pytest plugin and its report. The plugin listens to JAX's compile events
(`jax.monitoring`: jaxpr tracing, jaxpr -> MLIR lowering, getting each XLA program --
compiled, or read back from the persistent compilation cache) and to each test's wall and
process CPU seconds (setup, call and teardown; a subprocess's CPU is not the worker's), and
writes one JSON per pytest-xdist worker. The report sums them per file and lists the
heaviest tests:

    .venv/bin/python -m pytest -n 2 -p benchmarks.suite_profile     # writes runs/suite_profile/
    .venv/bin/python benchmarks/suite_profile.py [DIR] [--top 40]  # the tables

Use a fresh compilation cache (`T2T_JAX_CACHE=/tmp/fresh`) to see what CI, which starts
without one, pays. Event seconds are wall time on the worker's thread; XLA compiles with
several threads, so they do not add up to CPU seconds.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import time

import pytest

OUT_DIR = os.environ.get("SUITE_PROFILE_DIR", "runs/suite_profile")
EVENTS = {"trace": "/jax/core/compile/jaxpr_trace_duration",
          "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "compile": "/jax/core/compile/backend_compile_duration",   # or a cache read
          "cache read": "/jax/compilation_cache/cache_retrieval_time_sec"}

_current = ["(outside tests)"]
_stats: dict = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))


def _record(event: str, seconds: float, **_) -> None:
    entry = _stats[_current[0]][event]
    entry[0] += 1
    entry[1] += seconds


def pytest_configure(config) -> None:
    import jax

    jax.monitoring.register_event_duration_secs_listener(_record)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item.nodeid
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    _record("wall", time.perf_counter() - wall)
    _record("cpu", time.process_time() - cpu)
    _current[0] = "(outside tests)"


def pytest_sessionfinish(session) -> None:
    os.makedirs(OUT_DIR, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(OUT_DIR, f"{worker}.json"), "w") as f:
        json.dump({test: dict(events) for test, events in _stats.items()}, f)


def load(directory: str) -> dict:
    """{test id: {event: [count, seconds]}} of every worker's file in `directory`."""
    tests: dict = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path) as f:
            tests.update(json.load(f))
    return tests


def rows(tests: dict, by_file: bool) -> list:
    """(name, cpu s, wall s, programs, trace s, lower s, compile-or-read s, cache reads),
    heaviest CPU first."""
    sums: dict = collections.defaultdict(lambda: [0.0, 0.0, 0, 0.0, 0.0, 0.0, 0])
    for test, events in tests.items():
        name = test.split("::")[0] if by_file else test
        row = sums[name]
        row[0] += events.get("cpu", [0, 0.0])[1]
        row[1] += events.get("wall", [0, 0.0])[1]
        row[2] += events.get(EVENTS["compile"], [0, 0.0])[0]
        for i, key in ((3, "trace"), (4, "lower"), (5, "compile")):
            row[i] += events.get(EVENTS[key], [0, 0.0])[1]
        row[6] += events.get(EVENTS["cache read"], [0, 0.0])[0]
    return sorted(((name, *row) for name, row in sums.items()), key=lambda r: -r[1])


def table(found: list, top: int, title: str) -> str:
    total_cpu = sum(r[1] for r in found) or 1.0
    lines = [f"| {title} | CPU s | wall s | programs | trace s | lower s | compile or read s | "
             "cache reads |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {name} | {cpu:.1f} ({100 * cpu / total_cpu:.1f}%) | {wall:.1f} | {n} | "
              f"{trace:.1f} | {lower:.1f} | {compile_s:.1f} | {reads} |"
              for name, cpu, wall, n, trace, lower, compile_s, reads in found[:top]]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory", nargs="?", default=OUT_DIR)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args(argv)
    tests = load(args.directory)
    if not tests:
        print(f"no profile in {args.directory}: run pytest with -p benchmarks.suite_profile")
        return 1
    every = rows(tests, by_file=False)
    totals = [sum(r[i] for r in every) for i in range(1, 8)]
    print(f"{len(tests)} tests: {totals[0]:.0f} s CPU in the workers, {totals[1]:.0f} s wall "
          f"summed; {totals[2]} programs ({totals[6]} read from the persistent cache, the rest "
          f"compiled); trace {totals[3]:.0f} s, lower {totals[4]:.0f} s, compile or read "
          f"{totals[5]:.0f} s\n")
    print(table(rows(tests, by_file=True), args.top, "file"), "\n")
    print(table(every, args.top, "test"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
