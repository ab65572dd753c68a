"""`t2t ablate GRID --plan --hardware=H`: each distinct stage's step built for a TPU slice and
costed (t2t/ablations/cost.py). The XLA compile itself is tests/train/test_compile.py's;
here it is replaced by a report of known FLOPs so the arithmetic, the reuse of compiled
steps and the command are checked in seconds."""
import importlib.util
import json

import pytest

from t2t import cli
from t2t.ablations import cost, grid as grid_lib
from t2t.run import aot

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu not installed (pip install -e '.[test]')")
GRID = "t2t/configs/ablations/t5_table2.gin"
CELLS = ["denoising-encoder_decoder", "random_init"]
XLA_FLOPS = {"train": 3.0e12, "finetune": 1.0e12}   # per chip and step


@pytest.fixture
def compiles(monkeypatch):
    """aot.compile_prepared replaced: a Report with XLA_FLOPS[step]; the steps it was
    asked for are listed."""
    asked = []

    def fake(prepared):
        asked.append(prepared.step)
        chips = prepared.slice.num_chips
        return aot.Report(
            step=prepared.step, slice=prepared.slice, num_slices=1,
            mesh=dict(prepared.trainer.mesh.shape), family=prepared.trainer.model.family,
            num_params=1, batch_shapes={}, state_bytes={"parameters": 0, "optimizer_state": 0,
                                                         "batch": 0},
            memory={"arguments": 2**30, "outputs": 0, "aliased": 0, "temporaries": 2**30,
                    "generated_code": 0},
            xla_flops=XLA_FLOPS[prepared.step], model_flops=XLA_FLOPS[prepared.step] * chips,
            largest=[], train_steps=prepared.trainer.config.train_steps)
    monkeypatch.setattr(aot, "compile_prepared", fake)
    return asked


@needs_libtpu
def test_a_plan_costs_each_stage_and_compiles_each_distinct_step_once(compiles, tmp_path):
    grid = grid_lib.load_grid(GRID, "tiny")
    cells = grid.select([f"^{c}$" for c in CELLS])
    cache = str(tmp_path / "cache.json")
    plan = cost.plan_grid(grid, cells, 3, "tpu_v5e_8", cache, str(tmp_path), say=lambda m: None)
    # the control's fine-tuning is the same step as the pretrained cell's: compiled once
    assert sorted(compiles) == ["finetune", "train"]
    assert plan.compiled == 2 and plan.topology == "v5e-8" and plan.chips == 8
    peak = 197e12                                     # v5e's bf16 datasheet peak per chip
    rows = {(s.cell, s.stage): s for s in plan.stages}
    pre = rows["Denoising / Encoder-decoder", "pretrain"]
    assert pre.steps == 300 and pre.report["fits"]       # the tiny scale's TRAIN_STEPS
    assert pre.chip_hours == pytest.approx(300 * XLA_FLOPS["train"] / peak * 8 / 3600)
    tune = rows["Random init (control)", "finetune"]
    assert list(tune.tasks) == [t for t, _ in grid.scale.tasks]
    assert tune.chip_hours == pytest.approx(
        len(tune.tasks) * tune.steps * XLA_FLOPS["finetune"] / peak * 8 / 3600)
    assert ("Random init (control)", "pretrain") not in rows
    assert plan.chip_hours == pytest.approx(3 * sum(s.chip_hours for s in plan.stages))
    assert plan.lines()[-1].startswith("total: ")
    # a second plan reads every step from the cache: nothing compiles, the same numbers
    again = cost.plan_grid(grid, cells, 3, "tpu_v5e_8", cache, str(tmp_path),
                           say=lambda m: None)
    assert again.compiled == 0 and len(compiles) == 2
    assert again.to_dict() == plan.to_dict()
    assert len(json.load(open(cache))) == 2


@needs_libtpu
def test_the_command_prints_the_plan_and_writes_its_json(compiles, tmp_path, capsys):
    out = tmp_path / "plan.json"
    code = cli.main(["ablate", GRID, "--scale=tiny", "--plan", "--hardware=tpu_v5e_8",
                     "--cells=^random_init$", f"--out_dir={tmp_path}", f"--json={out}"])
    printed = capsys.readouterr().out
    assert code == 0 and compiles == ["finetune"]
    assert "Random init (control)" in printed and "total: " in printed
    plan = json.loads(out.read_text())
    assert plan["topology"] == "v5e-8" and plan["chips"] == 8 and plan["stages"]
    assert (tmp_path / "plan_cache.json").exists()      # the default cache: OUT_DIR's


def test_a_scale_on_no_tpu_needs_hardware_in_one_line(capsys, tmp_path):
    code = cli.main(["ablate", GRID, "--scale=tiny", "--plan", f"--out_dir={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--plan needs --hardware=" in err[0]


def test_the_cache_key_ignores_what_only_a_run_reads():
    signature = {"params": {"w": [[4, 4], "float32"]}}
    run = ("MODEL_DIR = '/a'\nSEED = 0\nTrainConfig.train_steps = 100\n"
           "TrainConfig.model_dir = '/a'\nTransformerConfig.d_model = 64\n")
    other_run = run.replace("/a", "/b").replace("SEED = 0", "SEED = 2").replace("100", "7")
    assert cost.step_key(run, signature) == cost.step_key(other_run, signature)
    assert cost.step_key(run, signature) != cost.step_key(run.replace("64", "32"), signature)
    assert cost.step_key(run, signature) != cost.step_key(
        run, {"params": {"w": [[4, 8], "float32"]}})


def test_hardware_lines_are_replaced():
    lines = ["runs/pretrain.gin", "hardware/tpu_v5e_256.gin", "BATCH_SIZE = 128"]
    assert cost.on_hardware(lines, "tpu_v5p_128") == [
        "runs/pretrain.gin", "BATCH_SIZE = 128", "hardware/tpu_v5p_128.gin"]
    assert cost.hardware_file("my/slice.gin") == "my/slice.gin"


@needs_libtpu
def test_a_stage_whose_files_are_not_here_is_listed_as_not_counted(compiles, tmp_path):
    """A fine-tuning that needs a vocabulary (or data) this host lacks, as BERT's paper
    fine-tunings without GLUE: its row says why, the total leaves it out, nothing compiles."""
    grid = grid_lib.load_grid("t2t/configs/ablations/bert_table5.gin", "tiny",
                              ["classifier_experiment.vocabulary = '/nonexistent/vocab.txt'"])
    plan = cost.plan_grid(grid, grid.select(["^random_init$"]), 1, "tpu_v5e_8",
                          str(tmp_path / "cache.json"), str(tmp_path), say=lambda m: None)
    stage, = plan.stages
    assert not stage.counted and stage.chip_hours == 0 and compiles == []
    assert stage.note.startswith("not counted: ") and "/nonexistent/vocab.txt" in stage.note
    assert "1 stage(s) not counted" in "\n".join(plan.lines())


@needs_libtpu
def test_a_stage_the_slice_cannot_lay_out_says_why(compiles, tmp_path):
    """BERT Table 6's 3-head size on a mesh with tensor=2: the row names the parameter and
    the axis (t2t compile's one line), the plan goes on."""
    grid = grid_lib.load_grid(GRID, "tiny", ["TransformerConfig.num_heads = 3", "BATCH_SIZE = 128"])
    plan = cost.plan_grid(grid, grid.select(["^random_init$"]), 1, "tpu_v5e_256",
                          str(tmp_path / "cache.json"), str(tmp_path), say=lambda m: None)
    stage, = plan.stages
    assert not stage.counted and compiles == []
    assert stage.note.startswith("not counted, does not lay out: ") and "heads=3" in stage.note
