"""Shared helpers for the benchmark scripts: machine/version header, timing, RESULTS.md."""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from t2t import platforms, precision

# libtpu is installed (the `test` extra, for `t2t compile`), so JAX would probe for a TPU at
# start-up and print libtpu's warnings on this CPU host. These scripts time the CPU
# (train_step also a GPU), and each imports this module before JAX: ask for the CPU (and
# CUDA when its plugin is installed) unless JAX_PLATFORMS is set or this is a TPU host.
# compile_table.py compiles for TPU topologies and does not import this module.
platforms.set_default_platforms()

RESULTS = Path(__file__).with_name("RESULTS.md")


def cpu_name() -> str:
    return precision.cpu_model(precision.read_cpuinfo())


def host_flags() -> str:
    """The CPU flags that decide bfloat16 speed, and what they mean for bf16 rows, e.g.
    'avx512_bf16 yes, amx_bf16 no, avx512f yes, avx2 yes: native bf16 matmuls'."""
    flags = precision.cpu_flags(precision.read_cpuinfo())
    if flags is None:
        return "CPU flags unknown (no /proc/cpuinfo)"
    marks = ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in precision.REPORTED_CPU_FLAGS)
    if any(f in flags for f in precision.BF16_CPU_FLAGS):
        return f"{marks}: native bf16 matmuls"
    return (f"{marks}: NO native bfloat16 on this CPU; XLA emulates bf16 matmuls, so read "
            "bf16 rows as emulated, not as a bf16 host's speed")


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def versions(*names: str) -> str:
    out = [f"Python {platform.python_version()}"]
    for n in names:
        try:
            out.append(f"{n} {metadata.version(n)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def machine_line(*packages: str) -> str:
    """CPU model and count, its bf16 flags, OS, versions: the header of every result."""
    return (f"Machine: {cpu_name()}, {os.cpu_count()} logical CPUs, {platform.system()} "
            f"{platform.machine()} ({host_flags()}); {versions(*packages)}.")


def interleaved(fns: Dict[str, Callable[[], None]], rounds: int, warmup: int = 1,
                log: Callable[[str], None] = print,
                cpu: Optional[Dict[str, List[float]]] = None,
                settle: int = 0) -> Dict[str, List[float]]:
    """Warm each fn up, then time them A, B, C, A, B, C, ... so machine drift hits all.
    Wall seconds per call; `cpu`, when given, gets each call's process CPU seconds.
    `settle` untimed calls precede each timed one: a step right after another framework's
    can run slower than in a training loop (benchmarks/README.md)."""
    for name, fn in fns.items() if warmup else ():
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn()
        log(f"  warm-up {name}: {time.perf_counter() - t0:.1f} s (load {loadavg()})")
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            for _ in range(settle):
                fn()
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            if cpu is not None:
                cpu.setdefault(name, []).append(time.process_time() - c0)
        log(f"  round {r + 1}/{rounds}: " + ", ".join(
            f"{k} {v[-1]:.3f}s" for k, v in times.items()) + f" (load {loadavg()})")
    return times


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]],
                   align: str = "") -> str:
    align = align or ("l" + "r" * (len(header) - 1))
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def append_results(title: str, body: str) -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    RESULTS.write_text(text.rstrip("\n") + f"\n\n## {title} ({stamp})\n\n{body.strip()}\n")
