"""Encoder self-attention time and memory vs length: dense, sliding window, block-sparse.

One t2t `MultiHeadAttention` layer at base shapes (12 heads of 64, d_model 768, batch 1,
float32) as the Encoder runs it for each `TransformerConfig.attention_pattern` (issue 59,
part 5), at 1,024 -> 8,192 tokens on the CPU:

* ``dense``: the ordinary path (`dot_product_attention`, an l x l score matrix); the
  inputs have no padding, so the Encoder passes it no mask;
* ``sliding_window``: Longformer (t2t/nn/longformer.py), window 512 and one global token
  (the first, as [CLS]), the config's separate global projections; `max_global_tokens` is
  the number of global tokens;
* ``block_sparse``: BigBird-ITC (t2t/nn/block_sparse.py `encoder_attention`), blocks of 64
  and 3 random blocks, layer 0's plan.

The sparse patterns get the Encoder's `TokenMask` (`sparse_attention.token_mask`), built
inside the jitted call as the Encoder builds it. Two programs per cell, jitted and compiled
ahead of time: the forward, and forward + backward (the gradient of the summed output with
respect to the parameters and the input). Time: the median of ``--runs`` calls after
``--warmup`` (`block_until_ready`). Memory: XLA's compiled temporary + output buffers
(`compiled.memory_analysis()`: what a call allocates besides its inputs, deterministic),
and the peak RSS growth of the calls (Linux's VmHWM, reset before each program). Each
(length, pattern) cell runs in a Python process of its own, so that its peak RSS is its
own and an out-of-memory kill costs one cell (``--in-process``: all in this one, RSS then
includes what earlier cells left to the allocator). A program whose temporary + output
buffers exceed ``--memory-fraction`` of MemAvailable (or ``--memory-limit-gib``) is
compiled, its memory reported, and not run; its row says so.

    python benchmarks/long_attention.py [--lengths 1024 2048 4096 8192] [--runs 5]
        [--out long_attention.json] [--plot [PNG]] [--no-write]

Prints a Markdown table, appends it to RESULTS.md with the machine (unless --no-write),
writes every number to ``--out`` (JSON) and, with ``--plot``, time and memory against
length, log-log, to benchmarks/long_attention.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

os.environ.setdefault("JAX_PLATFORMS", "cpu")      # a CPU benchmark, RSS is host memory
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402

LENGTHS = (1024, 2048, 4096, 8192)
PATTERNS = ("dense", "sliding_window", "block_sparse")
PROGRAMS = ("forward", "forward_backward")
PLOT = Path(__file__).with_name("long_attention.png")
MIB = 2 ** 20
INIT_LENGTH = 8     # tokens the parameters are initialised on (they have no length)


@dataclasses.dataclass(frozen=True)
class Shape:
    """The layer and the sparse patterns' settings every cell shares."""

    heads: int = 12
    head_dim: int = 64
    window: int = 512          # Longformer: attention_window (w/2 keys on each side)
    global_tokens: int = 1     # Longformer: the first tokens are global
    block: int = 64            # BigBird: sparse_block_size
    random_blocks: int = 3     # BigBird: num_random_blocks


def layer_config(pattern: str, length: int, shape: Shape):
    """The TransformerConfig of one encoder layer with `pattern` (no dropout, float32)."""
    from t2t.nn.config import TransformerConfig
    return TransformerConfig(
        d_model=shape.heads * shape.head_dim, num_heads=shape.heads, head_dim=shape.head_dim,
        num_encoder_layers=1, dropout_rate=0.0, position_embedding="learned",
        max_length=length, scan_layers=False, attention_pattern=pattern,
        attention_window=(shape.window,), max_global_tokens=shape.global_tokens,
        sparse_block_size=shape.block, num_random_blocks=shape.random_blocks)


def programs(pattern: str, length: int, shape: Shape):
    """(forward, forward + backward, params, x): jitted functions of (params, x) running
    t2t's MultiHeadAttention with the Encoder's mask for `pattern`."""
    import jax
    import jax.numpy as jnp

    from t2t.nn.attention import MultiHeadAttention
    from t2t.nn.sparse_attention import token_mask

    cfg = layer_config(pattern, length, shape)
    attn = MultiHeadAttention(cfg)

    def mask(x):
        if pattern == "dense":        # no padding, not causal: the Encoder passes no mask
            return None
        tokens = jnp.zeros(x.shape[:2], jnp.int32)
        global_tokens = None
        if pattern == "sliding_window":
            global_tokens = jnp.broadcast_to(jnp.arange(x.shape[1]) < shape.global_tokens,
                                             x.shape[:2])
        return token_mask(tokens, None, global_tokens)

    def forward(params, x):
        return attn.apply({"params": params}, x, x, mask(x))

    def loss(params, x):
        return jnp.sum(forward(params, x))

    x = jax.random.normal(jax.random.PRNGKey(0), (1, length, cfg.d_model), jnp.float32)
    params = init_params(pattern, shape)
    return jax.jit(forward), jax.jit(jax.grad(loss, argnums=(0, 1))), params, x


@functools.lru_cache(maxsize=None)
def init_params(pattern: str, shape: Shape):
    """The layer's parameters, the same at every length (projections [embed, heads, kv]):
    initialised once per pattern on `INIT_LENGTH` tokens."""
    import jax
    import jax.numpy as jnp

    from t2t.nn.attention import MultiHeadAttention
    from t2t.nn.sparse_attention import token_mask

    cfg = layer_config(pattern, INIT_LENGTH, shape)
    tokens = jnp.zeros((1, INIT_LENGTH), jnp.int32)
    # Longformer creates its global projections with or without global tokens
    mask = None if pattern == "dense" else token_mask(tokens, None, None)

    def init(x):
        return MultiHeadAttention(cfg).init(jax.random.PRNGKey(1), x, x, mask)["params"]
    return jax.jit(init)(jnp.zeros((1, INIT_LENGTH, cfg.d_model), jnp.float32))


def _status_kib(field: str) -> Optional[int]:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def mem_available() -> Optional[int]:
    """MemAvailable in bytes (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def rss_peak_growth(fn: Callable[[], object]):
    """(fn's result, bytes the process's peak RSS rose above its RSS before fn). The peak
    (Linux's VmHWM) is first reset to the current RSS; where that cannot be done (not
    Linux, or a kernel without `clear_refs` 5) the growth is None: the peak would be
    earlier work's, the compiler's included."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return fn(), None
    before = _status_kib("VmRSS")
    result = fn()
    peak = _status_kib("VmHWM")
    growth = None if before is None or peak is None else max(0, peak - before) * 1024
    return result, growth


def measure_program(name: str, jitted, params, x, *, runs: int, warmup: int,
                    limit_bytes: Optional[int], log: Callable[[str], None]) -> Dict:
    """Compile `jitted` for (params, x), read XLA's memory analysis, and time it unless its
    buffers exceed `limit_bytes`: {temp_bytes, output_bytes, argument_bytes, ms, runs_ms,
    peak_rss_bytes, skipped}."""
    import jax

    compiled = jitted.lower(params, x).compile()
    analysis = compiled.memory_analysis()
    out = {"temp_bytes": int(analysis.temp_size_in_bytes),
           "output_bytes": int(analysis.output_size_in_bytes),
           "argument_bytes": int(analysis.argument_size_in_bytes),
           "ms": None, "runs_ms": [], "peak_rss_bytes": None, "skipped": None}
    need = out["temp_bytes"] + out["output_bytes"]
    if limit_bytes is not None and need > limit_bytes:
        out["skipped"] = (f"not run: XLA needs {need / 2**30:.2f} GiB of buffers, over the "
                          f"{limit_bytes / 2**30:.2f} GiB limit")
        log(f"  {name}: {out['skipped']}")
        return out

    def call():
        jax.block_until_ready(compiled(params, x))

    def timed():
        return _common.interleaved({name: call}, runs, warmup=warmup, log=log)[name]

    seconds, out["peak_rss_bytes"] = rss_peak_growth(timed)
    out["runs_ms"] = [s * 1e3 for s in seconds]
    out["ms"] = _common.median(out["runs_ms"])
    return out


def measure_cell(length: int, pattern: str, shape: Shape, *, runs: int, warmup: int,
                 memory_fraction: float, memory_limit_gib: Optional[float],
                 log: Callable[[str], None]) -> Dict:
    """One (length, pattern) cell: both programs' memory and times."""
    log(f"{pattern} at {length} tokens (load {_common.loadavg()})")
    forward, forward_backward, params, x = programs(pattern, length, shape)
    cell = {"length": length, "pattern": pattern, "skipped": None,
            "dense_fallback": dense_fallback(length, pattern, shape)}
    for name, jitted in zip(PROGRAMS, (forward, forward_backward)):
        available = mem_available()
        limits = [int(memory_fraction * available)] if available else []
        if memory_limit_gib is not None:
            limits.append(int(memory_limit_gib * 2 ** 30))
        cell[name] = measure_program(f"{pattern} {name} l={length}", jitted, params, x,
                                     runs=runs, warmup=warmup,
                                     limit_bytes=min(limits) if limits else None, log=log)
    return cell


def dense_fallback(length: int, pattern: str, shape: Shape) -> bool:
    """Whether `block_sparse` attends densely at `length` (too few blocks for the pattern,
    as transformers falls back to original_full)."""
    from t2t.nn.block_sparse import use_block_sparse
    return pattern == "block_sparse" and not use_block_sparse(length, shape.block,
                                                              shape.random_blocks)


def _cell_args(args) -> List[str]:
    out = [f"--runs={args.runs}", f"--warmup={args.warmup}",
           f"--memory-fraction={args.memory_fraction}"]
    if args.memory_limit_gib is not None:
        out.append(f"--memory-limit-gib={args.memory_limit_gib}")
    for field in dataclasses.fields(Shape):
        out.append(f"--{field.name.replace('_', '-')}={getattr(args, field.name)}")
    return out


def cell_in_worker(length: int, pattern: str, shape: Shape, args,
                   log: Callable[[str], None]) -> Dict:
    """`measure_cell` in a fresh Python process (its own peak RSS; an OOM kill ends only it)."""
    command = [sys.executable, os.path.abspath(__file__), "--worker", str(length), pattern,
               *_cell_args(args)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return failed_cell(length, pattern, shape,
                           f"worker stopped: over the {args.timeout:g} s limit")
    for line in done.stderr.splitlines():
        log("  | " + line)
    if done.returncode == 0:
        return json.loads(done.stdout.strip().splitlines()[-1])
    if done.returncode < 0:
        reason = f"worker killed by signal {-done.returncode}"
        if done.returncode == -9:
            reason += " (out of memory?)"
    else:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        reason = f"worker failed (exit {done.returncode}): {tail[:200]}"
    return failed_cell(length, pattern, shape, reason)


def failed_cell(length: int, pattern: str, shape: Shape, reason: str) -> Dict:
    empty = {"temp_bytes": None, "output_bytes": None, "argument_bytes": None, "ms": None,
             "runs_ms": [], "peak_rss_bytes": None, "skipped": reason}
    return {"length": length, "pattern": pattern, "skipped": reason,
            "dense_fallback": dense_fallback(length, pattern, shape),
            **{name: dict(empty) for name in PROGRAMS}}


def buffer_mib(program: Dict) -> Optional[float]:
    """XLA's temporary + output buffers of a program, MiB."""
    if program["temp_bytes"] is None:
        return None
    return (program["temp_bytes"] + program["output_bytes"]) / MIB


def _num(value: Optional[float], digits: int = 1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def table(cells: Sequence[Dict]) -> str:
    """Length x pattern: ms and XLA MiB of both programs, the peak RSS growth, why skipped."""
    rows = []
    for c in cells:
        fwd, both = c["forward"], c["forward_backward"]
        rss = both["peak_rss_bytes"]
        notes = ["too few blocks: block_sparse attends densely"] if c["dense_fallback"] else []
        if c["skipped"]:                                   # the cell's worker failed
            notes.append(c["skipped"])
        else:
            notes += [f"{label} {c[name]['skipped']}" for name, label in
                      zip(PROGRAMS, ("fwd", "fwd+bwd")) if c[name]["skipped"]]
        rows.append([f"{c['length']:,}", c["pattern"], _num(fwd["ms"]), _num(both["ms"]),
                     _num(buffer_mib(fwd)), _num(buffer_mib(both)),
                     _num(None if rss is None else rss / MIB),
                     "; ".join(notes)])
    return _common.markdown_table(
        ["length", "pattern", "fwd ms", "fwd+bwd ms", "fwd MiB (XLA)", "fwd+bwd MiB (XLA)",
         "fwd+bwd peak RSS MiB", "note"], rows, align="llrrrrrl")


def plot(cells: Sequence[Dict], shape: Shape, path: Path, title: str) -> None:
    """Two log-log panels against length: time (ms) and XLA buffers (MiB); solid
    forward + backward, dashed forward; programs not run are absent from the time panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (time_ax, mem_ax) = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = dict(zip(PATTERNS, ("tab:red", "tab:blue", "tab:green")))
    for pattern in PATTERNS:
        mine = sorted((c for c in cells if c["pattern"] == pattern), key=lambda c: c["length"])
        for name, style in zip(PROGRAMS, ("--", "-")):
            label = f"{pattern} {'fwd+bwd' if name == 'forward_backward' else 'fwd'}"
            for ax, value in ((time_ax, lambda p: p["ms"]), (mem_ax, buffer_mib)):
                points = [(c["length"], value(c[name])) for c in mine
                          if value(c[name]) is not None]
                if points:
                    ax.plot(*zip(*points), style, marker="o", color=colours[pattern],
                            label=label)
    lengths = sorted({c["length"] for c in cells})
    for ax, ylabel in ((time_ax, "time per call (ms, median)"),
                       (mem_ax, "XLA temp + output buffers (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    for ax in (time_ax, mem_ax):
        if ax.lines:                    # the time panel is empty when nothing ran
            ax.legend(fontsize=8)
            break
    fig.suptitle(f"{title}\n{shape.heads} heads x {shape.head_dim}, batch 1, float32; "
                 f"window {shape.window} + {shape.global_tokens} global; blocks of "
                 f"{shape.block}, {shape.random_blocks} random", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--patterns", nargs="+", default=list(PATTERNS), choices=PATTERNS)
    for field in dataclasses.fields(Shape):
        p.add_argument(f"--{field.name.replace('_', '-')}", type=int, default=field.default)
    p.add_argument("--runs", type=int, default=5, help="timed calls per program (median)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls first")
    p.add_argument("--memory-fraction", type=float, default=0.8,
                   help="run a program only if its XLA buffers fit this share of MemAvailable")
    p.add_argument("--memory-limit-gib", type=float, default=None,
                   help="and only if they fit this many GiB")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per cell's process")
    p.add_argument("--in-process", action="store_true",
                   help="every cell in this process (no per-cell RSS, no OOM isolation)")
    p.add_argument("--out", help="write every number here (JSON)")
    p.add_argument("--plot", nargs="?", const=str(PLOT), default=None,
                   help=f"write the plot (PNG; default {PLOT.name} beside this script)")
    p.add_argument("--no-write", action="store_true", help="do not append to RESULTS.md")
    p.add_argument("--worker", nargs=2, metavar=("LENGTH", "PATTERN"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> Dict:
    args = parse(argv)
    shape = Shape(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Shape)})

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    measure = dict(runs=args.runs, warmup=args.warmup, memory_fraction=args.memory_fraction,
                   memory_limit_gib=args.memory_limit_gib, log=log)
    if args.worker:
        cell = measure_cell(int(args.worker[0]), args.worker[1], shape, **measure)
        print(json.dumps(cell))
        return cell
    cells = []
    for length in args.lengths:
        for pattern in args.patterns:
            cells.append(measure_cell(length, pattern, shape, **measure) if args.in_process
                         else cell_in_worker(length, pattern, shape, args, log))
    command = "python benchmarks/long_attention.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    header = (f"{_common.machine_line('jax', 'jaxlib', 'flax')} Load: {_common.loadavg()}.\n"
              f"`{command}`: one t2t MultiHeadAttention ({shape.heads} heads of "
              f"{shape.head_dim}, batch 1, float32) per attention_pattern: dense; "
              f"sliding_window (window {shape.window}, {shape.global_tokens} global token"
              f"{'s' if shape.global_tokens != 1 else ''}); block_sparse (blocks of "
              f"{shape.block}, {shape.random_blocks} random). Median of {args.runs} calls "
              f"after {args.warmup} warm-up; MiB = XLA's compiled temp + output buffers; "
              "peak RSS = the process's peak resident growth during the forward + backward "
              f"calls{' (one process for all cells)' if args.in_process else ''}.")
    text = table(cells)
    print(header + "\n\n" + text)
    result = {"host": {"machine": _common.machine_line("jax", "jaxlib", "flax"),
                       "cpu": _common.cpu_name(), "cpu_flags": _common.host_flags(),
                       "logical_cpus": os.cpu_count(), "load": _common.loadavg(),
                       "mem_available_bytes": mem_available()},
              "command": command, "shape": dataclasses.asdict(shape), "runs": args.runs,
              "warmup": args.warmup, "isolated": not args.in_process, "cells": cells}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(cells, shape, Path(args.plot), f"t2t encoder self-attention on {_common.cpu_name()}")
    if not args.no_write:
        _common.append_results("Sparse encoder self-attention: time and memory vs length",
                               header + "\n\n" + text)
    return result


if __name__ == "__main__":
    main()
