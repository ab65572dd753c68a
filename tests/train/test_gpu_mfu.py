"""benchmarks/gpu_mfu.py, the prepared accelerator run: its batch search against a fake
device, and the whole script on the CPU at tiny sizes, so it cannot break unseen."""
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path


from tests.jax_setup import cpu_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_mfu  # noqa: E402  (benchmarks/gpu_mfu.py)

GIB = gpu_mfu.GIB


def _fake_stage(limit_gib=40.0, need=None, oom=(), deadline=None):
    """A Stage whose compile reports XLA's memory analysis of a step needing `need(batch)`
    GiB (default 5 + 0.5 per row: 4 GiB of AdamW state, 1 of gradients, 0.5 a row), whose
    step runs out of memory for the batches in `oom`, on a device of `limit_gib`."""
    from t2t.nn.config import TransformerConfig
    need = need or (lambda b: 5 + 0.5 * b)
    stage = gpu_mfu.Stage.__new__(gpu_mfu.Stage)
    stage.model, stage.config, stage.log = "gpt", "best", lambda text: None
    stage.w = gpu_mfu.Workload("fake", "gpt", "", 16, probe=8, candidates=(64, 32, 16))
    stage.cfg = TransformerConfig(num_encoder_layers=0, num_decoder_layers=2)
    stage.deadline = deadline or time.time() + 100
    stage.warmup, stage.steps, stage.limit_at_batch = 1, 2, None
    stage.limit, stage.tried, stage.state, stage.abstract = limit_gib * GIB, [], None, None
    stage.last_compile_s = 0.01

    def compile_(batch):
        temp = (need(batch) - 4) * GIB         # 4 GiB of arguments, outputs all aliased
        analysis = types.SimpleNamespace(argument_size_in_bytes=4 * GIB,
                                         output_size_in_bytes=4 * GIB,
                                         alias_size_in_bytes=4 * GIB, temp_size_in_bytes=temp)
        return "step", {"rows": batch}, "abstract", analysis, 0.01

    def time_(compiled, example, abstract):
        if example["rows"] in oom:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        return [0.02, 0.01, 0.03]

    stage._compile, stage._time = compile_, time_
    return stage


def _outcomes(result):
    return [(t["batch"], t["outcome"]) for t in result["tried"]]


def test_the_search_jumps_to_the_largest_batch_predicted_to_fit():
    """Probe 8 needs 9 GiB: 64 is predicted at 37 GiB, over 95% of 97% of 40 GiB, so
    32 (21 GiB) is compiled and timed; the median step is kept."""
    result = _fake_stage().run()
    assert result["batch"] == 32 and result["step_s"] == 0.02
    assert _outcomes(result) == [(8, "20.0 ms"), (64, "predicted 37.0 GiB > 38.8"),
                                 (32, "20.0 ms")]
    assert result["tokens_per_step"] == 32 * 16 and result["flops_per_step"] > 0


def test_out_of_memory_or_a_larger_analysis_moves_one_batch_down():
    ran_out = _fake_stage(oom={32}).run()
    assert ran_out["batch"] == 16
    assert (32, "out of memory") in _outcomes(ran_out)
    # 32 needs 45 GiB by its own analysis: not run; the line through 8 and 32 allows 16
    steep = _fake_stage(need=lambda b: 9 if b == 8 else 9 + 1.5 * (b - 8)).run()
    assert steep["batch"] == 16
    assert (32, "needs 45.0 GiB > 38.8") in _outcomes(steep)


def test_the_probe_stands_when_time_is_up_or_nothing_larger_fits():
    late = _fake_stage(deadline=time.time() - 1).run()
    assert late["batch"] == 8 and (32, "no time left") in _outcomes(late)
    small = _fake_stage(limit_gib=12).run()
    assert small["batch"] == 8 and [b for b, _ in _outcomes(small)] == [8, 64, 32, 16]
    nothing = _fake_stage(oom={8, 4, 2}).run()
    assert "no batch ran" in nothing["error"]


def test_the_plan_fits_the_budget_and_every_variant_is_named():
    budgets = gpu_mfu.plan(["t5", "bert", "gpt"], ["previous", "best"], 530)
    assert list(budgets)[0] == "peak" and len(budgets) == 7
    assert sum(budgets.values()) + gpu_mfu.GRACE_SECONDS * 6 <= 530
    assert budgets["t5:best"] > budgets["gpt:best"] > budgets["bert:best"]
    assert all(flag.startswith("--xla_") for flags in gpu_mfu.VARIANTS.values()
               for flag in flags)


def test_the_tiny_run_writes_the_table(tmp_path):
    """The script end to end on the CPU: the peak, three models x two configurations, each
    compiled and timed at its probe batch 2 with 8 and 4 predicted not to fit (the tiny
    run's pretend limit is what batch 2 needs), the table under a heading naming the
    device, with the XLA flags of the `maxtext` variant accepted by this jaxlib."""
    results_md = tmp_path / "RESULTS.md"
    results_md.write_text("# Benchmark results\n")
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_mfu.py", "--tiny", "--out", str(tmp_path / "out"),
         "--results-md", str(results_md), "--budget", "600", "--xla-variant", "maxtext"],
        cwd=ROOT, env=cpu_env(1), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + (tmp_path / "out" / "stages.log"
                                                        ).read_text()[-3000:]
    text = results_md.read_text()
    assert "## Issue 60: MFU of the pretraining steps on one cpu (tiny, CPU)" in text
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "(tiny)" in line]
    seen = set()
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        title, config, batch, step_ms, tokens_s, tflops, mfu = cells[:7]
        seen.add((title.split()[0], config))
        assert batch == "2", row
        assert float(step_ms.replace(",", "")) > 0 and float(tokens_s.replace(",", "")) > 0
        assert 0 < float(mfu.rstrip("%")) < 100, row
        assert re.fullmatch(r"2: [\d.]+ ms; 8: predicted \S+ GiB > \S+; "
                            r"4: predicted \S+ GiB > \S+", cells[8]), row
    assert seen == {(m, c) for m in ("T5.1.1-large", "BERT-large", "GPT-2")
                    for c in ("previous", "best")}
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["peak"]["peak_flops"] > 0 and len(results) == 7
    for stage, r in results.items():
        if stage != "peak":
            assert r["batch"] == 2 and r["tokens_per_step"] == 2 * r["tokens_per_example"]
            assert r["flops_per_step"] / r["step_s"] < results["peak"]["peak_flops"]
    assert set(os.listdir(tmp_path / "out")) == {"stages.log", "results.jsonl", "table.md",
                                                 "results.json"}


def test_the_presets_read_as_gin_reads_them():
    """The stages read the model presets without t2t's gin layer (which imports the data
    pipeline's packages); they must give the config `t2t train` would build."""
    from t2t.nn.config import TransformerConfig
    from t2t.run import configurables, gin_utils
    for workload in gpu_mfu.WORKLOADS.values():
        gin_utils.parse([workload.preset])
        want = configurables.model_config(workload.family)
        assert TransformerConfig(**gpu_mfu.preset_bindings(workload.preset)) == want
