"""Ablation grids: cells from axes, rows and overrides; every shipped grid loads."""
import pathlib

import pytest

from t2t.ablations import grid as grid_lib
from t2t.run.gin_utils import CONFIG_DIR

AXES = {"Objective": {"Denoising": {"pretrain": ["OBJECTIVE = 'a'"]}, "LM": ["X = 1"]},
        "Architecture": {"Encoder-decoder": [], "Enc-dec, 6 layers": {
            "key": "half", "both": ["L = 1"], "finetune": ["F = 2"]}}}


def test_cells_are_the_product_of_the_axes_first_axis_slowest():
    cells = grid_lib.make_cells(AXES)
    assert [c.key for c in cells] == ["denoising-encoder_decoder", "denoising-half",
                                      "lm-encoder_decoder", "lm-half"]
    half = cells[1]
    assert half.label == "Denoising / Enc-dec, 6 layers"
    assert half.pretrain == ("OBJECTIVE = 'a'", "L = 1")
    assert half.finetune == ("L = 1", "F = 2")
    assert cells[2].pretrain == cells[2].finetune == ("X = 1",)


def test_rows_pick_cells_and_bad_labels_are_named():
    cells = grid_lib.make_cells(AXES, rows=[["LM", "Enc-dec, 6 layers"]])
    assert [c.key for c in cells] == ["lm-half"]
    with pytest.raises(ValueError, match="axis 'Objective' has no option 'MLM'"):
        grid_lib.make_cells(AXES, rows=[["MLM", "Encoder-decoder"]])
    with pytest.raises(ValueError, match="unknown keys"):
        grid_lib.make_cells({"A": {"x": {"pretrian": []}}})


def _ablation(**kwargs):
    spec = {"pretrain": [], "finetune": [], "tasks": {"t": "accuracy"}}
    args = dict(name="g", title="G", axes=AXES, scales={"tiny": spec})
    args.update(kwargs)
    return grid_lib.ablation(**args)


def test_overrides_paper_values_and_accounting_are_checked():
    grid = _ablation(overrides={"LM / Encoder-decoder": {"pretrain": ["Y = 2"]}},
                     paper_columns=["GLUE"], paper={"LM / Encoder-decoder": [79.56]},
                     accounting={"P": "LM / Enc-dec, 6 layers"})
    cell = grid.select(["lm-encoder"])[0]
    assert cell.pretrain == ("X = 1", "Y = 2") and cell.finetune == ("X = 1",)
    with pytest.raises(ValueError, match="paper values for unknown cells"):
        _ablation(paper_columns=["GLUE"], paper={"Prefix LM": [1.0]})
    with pytest.raises(ValueError, match="has 2 values for 1 paper_columns"):
        _ablation(paper_columns=["GLUE"], paper={"LM / Encoder-decoder": [1.0, 2.0]})
    with pytest.raises(ValueError, match="not_in_paper names 'LM / Encoder-decoder'"):
        _ablation(paper_columns=["GLUE"], paper={"LM / Encoder-decoder": [79.56]},
                  not_in_paper=["LM / Encoder-decoder"])          # it has paper values
    with pytest.raises(ValueError, match="not_in_paper names 'BART'"):
        _ablation(not_in_paper=["BART"])
    with pytest.raises(ValueError, match="no scale 'paper'"):
        _ablation(scale="paper")
    with pytest.raises(ValueError, match="no cell of g matches"):
        _ablation().select(["nothing"])


CURVE = "configs/ablations/micro_learning_curve.gin"     # a check of the scale, not a table
GRIDS = sorted(p.relative_to(CONFIG_DIR.parent).as_posix()
               for p in (CONFIG_DIR / "ablations").glob("*.gin")
               if p.relative_to(CONFIG_DIR.parent).as_posix() != CURVE)
MICRO_GRIDS = [p for p in GRIDS if "t5_table" in p or "bert_table" in p]


@pytest.mark.parametrize("path", GRIDS)
def test_every_shipped_grid_loads_with_paper_values_for_each_row(path):
    grid = grid_lib.load_grid(path, "tiny")
    assert grid.cells and grid.scale.tasks
    pretrained = {c.label for c in grid.cells if c.pretrained} - set(grid.not_in_paper)
    assert pretrained <= set(grid.paper), "a row without published values"
    if "t5_table" in path:   # the control is Table 1's "No pre-training" row, 17 GLUE below
        assert grid.paper[grid_lib.CONTROL_LABEL][0] == 66.22
        assert grid.paper_sd["GLUE"] == 0.235
    else:
        assert set(grid.paper) == pretrained
    assert len({c.key for c in grid.cells}) == len(grid.cells)
    vocab = ["T5_VOCABULARY = 'v'", "BERT_VOCABULARY = 'v'"]
    scales = ("small", "paper") + (("micro",) if path in MICRO_GRIDS else ())
    for scale in scales:   # every grid has the issue's three scales; the papers' tables micro
        other = grid_lib.load_grid(path, scale, vocab)
        assert [c.key for c in other.cells] == [c.key for c in grid.cells]


@pytest.mark.parametrize("path", MICRO_GRIDS)
def test_every_papers_table_ends_with_its_baselines_random_init_control(path):
    grid = grid_lib.load_grid(path, "micro")
    control = grid.cells[-1]
    assert control.label == "Random init (control)" and not control.pretrained
    like = next(c for c in grid.cells if c.label == grid.control)
    assert (control.pretrain, control.finetune) == (like.pretrain, like.finetune)
    assert [c for c in grid.cells if not c.pretrained] == [control]


def test_the_learning_curve_fine_tunes_from_checkpoints_its_pretraining_keeps():
    grid = grid_lib.load_grid(CURVE, "micro")
    assert [c.from_step for c in grid.cells] == [0, 125, 250, None, 1000, None]
    lines = " ".join(grid.scale.pretrain)
    assert "TRAIN_STEPS = %T5_MICRO_PRETRAIN_STEPS" in lines
    assert "TrainConfig.checkpoint_every = 125" in lines and "keep_checkpoints = 4" in lines
    table2 = grid_lib.load_grid("configs/ablations/t5_table2.gin", "micro")
    baseline = next(c for c in table2.cells if c.label == "Denoising / Encoder-decoder")
    assert grid.cells[3].pretrain == baseline.pretrain      # its 500-step row is Table 2's cell
    # past the budget: one 2,000-step pretraining (checkpoints every 500) serves both rows
    past = grid.cells[4:]
    assert past[0].pretrain == past[1].pretrain != baseline.pretrain
    assert past[0].pretrain[:2] == ("TRAIN_STEPS = 2000", "TrainConfig.checkpoint_every = 500")


def test_t5_table4_runs_barts_text_infilling_beside_the_papers_rows():
    grid = grid_lib.load_grid("configs/ablations/t5_table4.gin", "tiny")
    assert [c.key for c in grid.cells] == ["prefix_lm", "bert_style", "deshuffling",
                                           "bart_text_infilling", "random_init"]
    assert grid.not_in_paper == ("Text infilling (BART)",)
    assert "Text infilling (BART)" not in grid.paper and len(grid.paper) == 4
    bart = grid.select(["bart_text_infilling"])[0]
    assert "include 'objectives/bart_text_infilling.gin'" in bart.pretrain


def test_t5_table2_has_the_papers_ten_rows():
    grid = grid_lib.load_grid("configs/ablations/t5_table2.gin", "tiny")
    assert len(grid.cells) == 11 and grid.cells[-1].label == "Random init (control)"
    assert grid.paper["Denoising / Encoder-decoder"][0] == 83.28   # the baseline's GLUE
    lm = grid.select(["lm-language_model"])[0]
    assert "experiment.converter_options = {'loss_on_targets_only': False}" in lm.pretrain
    assert pathlib.Path(grid.source).name == "t5_table2.gin"


@pytest.mark.parametrize("path", GRIDS)
def test_every_tiny_cell_builds_its_pretraining_run_and_first_batch(path, tmp_path):
    """Task names, objectives, converters and lengths of every cell fit together (nothing
    is compiled: the paper-scale test and tests/ablations/test_runner.py train)."""
    from t2t.run import gin_utils
    from t2t.ablations import runner
    from t2t.run import experiment
    grid = grid_lib.load_grid(path, "tiny")
    for cell in grid.cells:
        files, bindings = runner.stage_config(grid, grid.scale.pretrain + cell.pretrain)
        gin_utils.parse(files, bindings + [f"MODEL_DIR = '{tmp_path / cell.key}'"])
        exp = experiment.experiment()
        batch = next(exp.data())
        rows = {v.shape[0] for v in batch.values()}
        assert rows == {exp.batch_size}, (cell.key, rows)
        assert any(v.any() for k, v in batch.items() if "weights" in k), cell.key


@pytest.mark.parametrize("scale", ["tiny", "micro"])
@pytest.mark.parametrize("path", ["configs/ablations/t5_table6.gin",
                                  "configs/ablations/t5_table7.gin"])
def test_denoising_rows_hold_their_targets(path, scale):
    """Each row's target length keeps >= 99% of its objective's targets whole on real
    chapters (and every input), so corruption rate and span length are what differ. The
    fit depends on the input length, not the text: `micro` is checked on the Bible too."""
    import numpy as np
    from t2t.run import gin_utils
    from t2t.ablations import runner
    from t2t.run import experiment
    grid = grid_lib.load_grid(path, scale)
    for cell in grid.cells:
        if not cell.pretrained:
            continue
        files, bindings = runner.stage_config(grid, grid.scale.pretrain + cell.pretrain)
        gin_utils.parse(files, bindings + ["MODEL_DIR = '/unused'", "CORPUS = 'bible_web'"])
        exp = experiment.experiment()
        task, lengths = exp.task, exp.converter.lengths
        every = 40 * 64 // lengths["inputs"]               # about as many tokens per scale
        examples = [ex for i in range(0, len(task.source), every)
                    for ex in task.preprocess(task.source[i], (0, i), lengths)]
        assert len(examples) > 300, cell.key
        assert max(len(ex["inputs"]) for ex in examples) <= lengths["inputs"], cell.key
        whole = np.mean([len(ex["targets"]) <= lengths["targets"] for ex in examples])
        assert whole >= 0.99, (cell.key, whole)


def test_a_scale_or_cell_the_grid_lacks_is_one_line_before_anything_runs(capsys):
    from t2t.cli import main
    assert main(["ablate", CURVE]) == 2                     # the curve grid has micro only
    assert main(["ablate", "configs/ablations/t5_table2.gin", "--cells", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "has no scale 'tiny'; scales: ['micro']" in err[0]
    assert "no cell of t5_table2 matches ['nosuch']" in err[1]
