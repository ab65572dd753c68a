"""benchmarks/gpu_table2.sh, the device run of T5 Table 2 at `gpu_micro`, on the CPU: the same
script at 2 steps with a tiny model on a stand-in bundle. Each seed's baseline and control
finish, $OUT holds only what comes back from a device (at most 8 small files: the stage
records in one tar, the rendered table, the log), and those records unpacked elsewhere
render the table with its control margin. That end-to-end run is under `-m slow` (run it
before spending a device on the script); CI checks the scale it runs at."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import tarfile

import pytest

from t2t.ablations import grid as grid_lib
from t2t.cli import main
from t2t.data import bundle
from t2t.data.catalog import low_resource

from tests.data.bundle_standin import standin_vocabulary, write_standin_datasets
from tests.jax_setup import cpu_env

ROOT = pathlib.Path(__file__).resolve().parents[2]
GRID = "configs/ablations/t5_table2.gin"
# the test's size: 2 steps of everything, a 1+1-layer model of width 32
TINY = ["--gin.TRAIN_STEPS=2", "--gin.EPOCHS=None", "--gin.T5_GPU_MICRO_PRETRAIN_STEPS=2",
        "--gin.T5_GPU_MICRO_BATCH=8", "--gin.NUM_LAYERS=1",
        "--gin.TransformerConfig.d_model=32", "--gin.TransformerConfig.d_ff=64",
        "--gin.TransformerConfig.num_heads=2", "--gin.TransformerConfig.head_dim=16",
        "--gin.TrainConfig.async_checkpoint=False", "--gin.evaluate_experiment.batch_size=16",
        "--gin.T5_GPU_MICRO_DATA_WORKERS=0"]   # worker processes: tests/data/test_bundle.py
CELLS = ("denoising-encoder_decoder", "random_init")


def test_the_scale_is_micro_with_64x_its_pretraining_on_a_gpu_reading_the_bundle():
    micro = grid_lib.load_grid(GRID, "micro")
    gpu = grid_lib.load_grid(GRID, "gpu_micro")
    assert [c.key for c in gpu.cells] == [c.key for c in micro.cells]
    assert gpu.scale.seeds == (0, 1, 2) and gpu.scale.task_columns
    assert [t for t, _ in gpu.scale.tasks] == ["micro_bundle_bbc_topic_200",
                                               "micro_bundle_spam_100"]
    assert [m for _, m in gpu.scale.tasks] == [m for _, m in micro.scale.tasks]
    lines = " ".join(gpu.scale.pretrain)
    assert "hardware/gpu.gin" in lines and "CORPUS = @bundle_corpus()" in lines
    assert "ablations/scales/t5_micro_model.gin" in lines
    # 64x micro's rows: 4,000 steps of 256 against 500 of 32
    from t2t.run import gin_utils
    gin_utils.parse([gpu.source], [])
    steps, batch = (gin_utils.query_macro(m) for m in ("T5_GPU_MICRO_PRETRAIN_STEPS",
                                                       "T5_GPU_MICRO_BATCH"))
    micro_steps = gin_utils.query_macro("T5_MICRO_PRETRAIN_STEPS")
    assert steps * batch == 64 * micro_steps * 32
    # fine-tuning is micro's, the tasks read from the bundle
    same = [line for line in micro.scale.finetune if "hardware/" not in line
            and "evaluate_experiment.batch_size" not in line]
    assert set(same) <= set(gpu.scale.finetune)
    assert "experiment.task = @bundle_task()" in gpu.scale.finetune


@pytest.fixture
def standin_bundle(tmp_path, monkeypatch):
    root = write_standin_datasets(tmp_path / "data")
    monkeypatch.setenv("T2T_DATA_DIR", str(root))
    low_resource._records.cache_clear()
    try:
        bundle.write(tmp_path / "bundle", vocabulary=standin_vocabulary(tmp_path / "vocab"))
    finally:
        low_resource._records.cache_clear()
    return tmp_path / "bundle"


@pytest.mark.slow   # ~35 s: four training stages in a subprocess; CI checks the micro scale
def test_the_device_script_runs_every_seed_and_its_records_render_the_margin(
        standin_bundle, tmp_path):
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = cpu_env(1, OUT=str(out), RUNS=str(runs), BUNDLE=str(standin_bundle), SEEDS="0 1",
                  BUDGET_S="400", PYTHON=sys.executable, WHL="")   # .whl/: the device's
    script = subprocess.Popen(["bash", "benchmarks/gpu_table2.sh", *TINY], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)   # its t2t ablate goes with it below
    try:
        said, _ = script.communicate(timeout=500)
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
            script.wait()
    log = (out / "gpu_table2.log").read_text()
    assert script.returncode == 0, said[-3000:]
    # what comes back from the device: few, small files
    back = sorted(p.name for p in out.iterdir())
    assert back == ["env.txt", "gpu_micro_runs.tar.gz", "gpu_table2.log",
                    "t5_table2_gpu_micro.md", "t5_table2_gpu_micro.png"]
    assert sum(p.stat().st_size for p in out.iterdir()) < 2**20
    assert "=== baseline and control at seeds 0 1, stopped after" in log   # each line stamped
    assert "=== exit 0 after" in log and "bundle " in (out / "env.txt").read_text()
    assert "Denoising / Encoder-decoder (seed 1): pretraining" in log
    assert "Random init (control) (seed 1): fine-tuning on micro_bundle_spam_100" in log
    assert all(line.startswith("[") for line in log.splitlines())
    # the stage records, unpacked here, render the table with its control margin
    here = tmp_path / "here"
    with tarfile.open(out / "gpu_micro_runs.tar.gz") as tar:
        names = tar.getnames()
        tar.extractall(here, filter="data")
    results = sorted(n for n in names if n.endswith("result.json"))
    assert results == [f"t5_table2/gpu_micro/{cell}/seed{s}/result.json"
                       for cell in CELLS for s in (0, 1)]
    assert not any("checkpoints" in n or "tensorboard" in n for n in names)
    result = json.loads((here / results[0]).read_text())
    assert result["pretrain"]["steps"] == 2 and result["pretrain"]["tokens"] == 2 * 8 * 192
    assert set(result["finetune"]) == {"micro_bundle_bbc_topic_200", "micro_bundle_spam_100"}
    assert result["pretrain"]["vocabulary"] == "spm_standin.model"
    docs = tmp_path / "docs"
    assert main(["ablate", GRID, "--scale=gpu_micro", "--render_only", f"--out_dir={here}",
                 f"--docs_dir={docs}"]) == 0
    md = (docs / "t5_table2_gpu_micro.md").read_text()
    table = md[:md.index("## Compute")].splitlines()
    rows = [line for line in table if line.startswith(("| Denoising | Encoder-decoder | ",
                                                       "| Random init (control) | – | "))]
    assert len(rows) == 2 and all(" | 0, 1 | " in row and "(n=2)" in row for row in rows)
    margin = [line for line in table if line.startswith("- Average: Denoising / "
                                                        "Encoder-decoder")]
    assert len(margin) == 1 and "(n=2) − control " in margin[0]
    assert "pooled seed sd" in margin[0] and "margin > 2 sd: **" in margin[0]
    assert (out / "t5_table2_gpu_micro.md").read_text().count("(n=2)") == md.count("(n=2)")
