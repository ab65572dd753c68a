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
    with pytest.raises(ValueError, match="no scale 'paper'"):
        _ablation(scale="paper")
    with pytest.raises(ValueError, match="no cell of g matches"):
        _ablation().select(["nothing"])


GRIDS = sorted(p.relative_to(CONFIG_DIR.parent).as_posix()
               for p in (CONFIG_DIR / "ablations").glob("*.gin"))


@pytest.mark.parametrize("path", GRIDS)
def test_every_shipped_grid_loads_with_paper_values_for_each_row(path):
    grid = grid_lib.load_grid(path, "tiny")
    assert grid.cells and grid.scale.tasks
    assert set(grid.paper) == {c.label for c in grid.cells}, "a row without published values"
    assert len({c.key for c in grid.cells}) == len(grid.cells)
    vocab = ["T5_VOCABULARY = 'v'", "BERT_VOCABULARY = 'v'"]
    for scale in ("small", "paper"):   # every grid has the three scales
        other = grid_lib.load_grid(path, scale, vocab)
        assert [c.key for c in other.cells] == [c.key for c in grid.cells]


def test_t5_table2_has_the_papers_ten_rows():
    grid = grid_lib.load_grid("configs/ablations/t5_table2.gin", "tiny")
    assert len(grid.cells) == 10
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


@pytest.mark.parametrize("path", ["configs/ablations/t5_table6.gin",
                                  "configs/ablations/t5_table7.gin"])
def test_tiny_denoising_rows_hold_their_targets(path):
    """Each row's target length keeps >= 99% of its objective's targets whole on real
    chapters (and every input), so corruption rate and span length are what differ."""
    import numpy as np
    from t2t.run import gin_utils
    from t2t.ablations import runner
    from t2t.run import experiment
    grid = grid_lib.load_grid(path, "tiny")
    for cell in grid.cells:
        files, bindings = runner.stage_config(grid, grid.scale.pretrain + cell.pretrain)
        gin_utils.parse(files, bindings + ["MODEL_DIR = '/unused'"])
        exp = experiment.experiment()
        task, lengths = exp.task, exp.converter.lengths
        examples = [ex for i in range(0, len(task.source), 40)
                    for ex in task.preprocess(task.source[i], (0, i), lengths)]
        assert len(examples) > 300, cell.key
        assert max(len(ex["inputs"]) for ex in examples) <= lengths["inputs"], cell.key
        whole = np.mean([len(ex["targets"]) <= lengths["targets"] for ex in examples])
        assert whole >= 0.99, (cell.key, whole)
