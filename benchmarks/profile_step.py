"""Where one train step's wall time goes: a jax.profiler trace joined with XLA's HLO.

Builds the same steps as ``train_step.py`` (t2t or HF Flax; BERT-base, T5.1.1-base or
GPT-2 small), runs two warm-up steps, traces a third with ``jax.profiler`` (perfetto JSON)
and dumps XLA's optimized HLO. Every traced op's time is then shared among the ops running
at the same moment (the CPU runtime runs independent ops concurrently, so raw durations
overlap) and grouped by kind (``ynn_fusion`` = a YNNPACK matmul/reduction, ``copy_*`` =
layout copies, ...) and by the model operation named in the HLO metadata, forward or
backward ("bwd"). "Idle" is time with no traced op: mostly Eigen matmuls, which run
asynchronously and are not traced.

    python benchmarks/profile_step.py --model gpt --impl t2t [--top 30] [--out DIR]
                                      [--size large --batch 64]
    python benchmarks/profile_step.py --model t5 --size micro   # the micro grids' step

On a GPU (or TPU) only the device's own events count: its kernels run one after another on
a stream, so each HLO op's time is the sum of its kernels' durations (the trace's
``hlo_op``), and "idle" is the device waiting between them.

``--impl torch`` or ``torch_bf16`` profiles PyTorch's step instead (``torch.profiler``: each
aten op's self CPU time summed over its calls, i.e. CPU time, not wall time). Compare two
implementations by running it twice (one at a time on a quiet machine).
"""
from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

IGNORED = ("$", "ThunkExecutor", "Thread", "Slinky", "end:")


def trace_step(model: str, impl: str, out: str) -> tuple[str, str]:
    """Trace one step -> (perfetto trace path, optimized HLO text path)."""
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_dump_to={out}/dump --xla_dump_hlo_pass_re=NONE")
    import train_step   # first: its _common import picks JAX's platforms before JAX starts
    import jax
    step = train_step.IMPLS[impl](model)
    step()
    step()
    with jax.profiler.trace(out, create_perfetto_trace=True):
        step()
    trace = glob.glob(f"{out}/**/perfetto_trace.json.gz", recursive=True)[0]
    hlos = sorted(glob.glob(f"{out}/dump/*train_step*after_optimizations.txt"),
                  key=os.path.getsize)
    return trace, hlos[-1]


def shared_time(trace_path: str) -> tuple[dict, float, float]:
    """{op name: wall µs shared with concurrent ops}, step span µs, idle µs."""
    with gzip.open(trace_path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    ops = [e for e in events if e.get("ph") == "X" and not e["name"].startswith(IGNORED)]
    devices = device_pids(events)
    if devices:                         # an accelerator: its kernels, named by their HLO op
        ops = [{**e, "name": e.get("args", {}).get("hlo_op", e["name"])}
               for e in ops if e.get("pid") in devices]
    edges = sorted([(e["ts"], 1, e["name"]) for e in ops]
                   + [(e["ts"] + e["dur"], -1, e["name"]) for e in ops])
    share, active = collections.Counter(), collections.Counter()
    last, idle = edges[0][0], 0.0
    for t, delta, name in edges:
        running = sum(active.values())
        if running:
            for k, n in active.items():
                share[k] += (t - last) * n / running
        else:
            idle += t - last
        last = t
        active[name] += delta
        if not active[name]:
            del active[name]
    return share, edges[-1][0] - edges[0][0], idle


def device_pids(events) -> set:
    """The trace's accelerator processes (perfetto process names '/device:GPU:0', ...)."""
    return {e.get("pid") for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"
            and re.search(r"/device:(GPU|TPU)", str(e.get("args", {}).get("name", "")))}


def op_categories(hlo_text: str) -> dict:
    """{HLO instruction name: 'kind  [bwd ]model/op'} from the optimized HLO's metadata."""
    out = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%([\w.\-]+) = .*$", hlo_text, re.M):
        name = m.group(1)
        kind = re.sub(r"\.\d+$", "", name)
        op = re.search(r'op_name="([^"]*)"', m.group(0))
        op = op.group(1) if op else ""
        bwd = "bwd " if "transpose(" in op else ""
        op = re.sub(r"layer_\d+|block/\d+|h/\d+", "L", op).replace("L._sublayer", "L")
        parts = [p for p in re.split(r"[/()]", op)
                 if p and p not in ("jvp", "transpose", "jit", "train_step")]
        out[name] = f"{kind:24s} {bwd}{'/'.join(parts[-3:])}"
    return out


def profile_torch(model: str, impl: str, top: int) -> None:
    """Print the `top` aten ops of one traced PyTorch step by self CPU time."""
    import time

    import torch
    import train_step
    step = train_step.IMPLS[impl](model)
    step()
    step()
    start = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"{impl} {model}: step wall {wall * 1e3:.0f} ms (profiled), self CPU "
          f"{total / 1e3:.0f} ms over {torch.get_num_threads()} threads")
    print(f"{'ms':>8}  {'calls':>6}  aten op")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]:
        print(f"{e.self_cpu_time_total / 1e3:8.1f}  {e.count:6d}  {e.key}")


def main(argv=None) -> None:
    import train_step   # first: its _common import picks JAX's platforms before JAX starts
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gpt", choices=["bert", "t5", "gpt"])
    p.add_argument("--impl", default="t2t")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--out", default=None, help="keep the trace and HLO here")
    p.add_argument("--size", default="base", choices=train_step.SIZES)
    p.add_argument("--batch", type=int, default=None, help="rows per step (train_step's)")
    args = p.parse_args(argv)
    train_step.set_size(p, args.size, args.model)
    if args.batch:
        train_step.BATCH[args.model]["batch"] = args.batch
    if args.impl.startswith("torch"):
        return profile_torch(args.model, args.impl, args.top)
    out = args.out or tempfile.mkdtemp(prefix="t2t_profile_")
    trace, hlo = trace_step(args.model, args.impl, out)
    share, span, idle = shared_time(trace)
    with open(hlo) as f:
        categories = op_categories(f.read())
    grouped = collections.Counter()
    for name, t in share.items():
        grouped[categories.get(name, name)] += t
    print(f"{args.impl} {args.model}: step span {span / 1e3:.0f} ms, idle (no traced op: "
          f"on a CPU mostly Eigen matmuls, on a GPU the device waiting) {idle / 1e3:.0f} ms")
    print(f"{'ms':>8}  kind / operation")
    for name, t in grouped.most_common(args.top):
        print(f"{t / 1e3:8.1f}  {name}")
    if args.out:
        shutil.copy(hlo, os.path.join(out, "step.hlo"))
        print(f"trace and HLO in {out}")
    else:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
