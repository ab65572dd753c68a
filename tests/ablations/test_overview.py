"""overview: every pretrained row of every table against its control, with the verdict
against twice the table's pooled seed sd, from the cells' result.json files."""
import json

import pytest

from t2t.ablations import grid as grid_lib, overview, runner

SCALE = {"tiny": {"pretrain": [], "finetune": [], "tasks": {"t": "accuracy"},
                  "averages": {"Average": ["t"]}}}


def _results(scores):
    return {key: [{"seed": s, "pretrain": {}, "finetune": {"t": {"metrics": {"accuracy": v}}}}
                  for s, v in enumerate(values)] for key, values in scores.items()}


def test_each_row_is_above_within_or_below_twice_the_pooled_sd():
    grid = grid_lib.ablation(name="g", title="Table 9: things", axes={"A": {"a": [], "b": [],
                                                                           "c": [], "d": []}},
                             scales=SCALE, control="a")
    # every row's seeds are m-1, m, m+1: variance 1, pooled sd 1, margin 2
    found = overview.gaps(grid, _results({"a": [82, 83, 84], "b": [76, 77, 78],
                                          "c": [80, 81, 82], "random_init": [79, 80, 81],
                                          "d": []}))
    assert [(g.table, g.row, g.n, g.gap, g.margin, g.verdict) for g in found] == [
        ("Table 9", "a", 3, 3.0, 2.0, "above"), ("Table 9", "b", 3, -3.0, 2.0, "below"),
        ("Table 9", "c", 3, 1.0, 2.0, "within")]          # d has no result: left out
    page = overview.markdown(found, "Average")
    assert "| Table 9 | b | 3 | 77.00 ±1.00 | 80.00 | -3.00 | 2.00 | **below** |" in page
    assert ("Of 3 pretrained rows in 1 table, **1 is above their control** by more than "
            "twice their table's pooled seed sd, 1 is within it and **1 is below**") in page
    assert overview.gaps(grid, _results({"a": [82, 83]})) == []          # no control yet


def _write_results(out_dir, grid, scores):
    for cell in grid.cells:
        for seed, value in enumerate(scores[cell.key]):
            path = runner.cell_dir(str(out_dir), grid, cell, seed)
            result = {"seed": seed, "precision": "float32", "pretrain": {}, "finetune": {
                task: {"metrics": {metric: value}} for task, metric in grid.scale.tasks}}
            (out_dir / path).mkdir(parents=True, exist_ok=True)
            (out_dir / path / "result.json").write_text(json.dumps(result))


def test_the_command_reads_the_cells_and_writes_a_page_and_a_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = "configs/ablations/t5_table4.gin"
    grid = grid_lib.load_grid(path, "micro")
    _write_results(tmp_path, grid, {"prefix_lm": [70, 72, 74], "bert_style": [80, 81, 82],
                                    "deshuffling": [84, 85, 86], "random_init": [83, 84, 85],
                                    "bart_text_infilling": []})      # not run: left out
    render = tmp_path / "docs" / "overview"
    assert overview.main([path, "--out_dir", str(tmp_path), "--render", str(render)]) == 0
    page = (tmp_path / "docs" / "overview.md").read_text()
    assert page == capsys.readouterr().out.rstrip("\n") + "\n"
    # pooled sd sqrt((4 + 1 + 1 + 1) / 4) = 1.32, margin 2.65; BERT-style -3.00 is below
    assert "| T5 Table 4 | BERT-style | 3 | 81.00 ±1.00 | 84.00 | -3.00 | 2.65 | **below** |" \
        in page
    assert "| T5 Table 4 | Deshuffling | 3 | 85.00 ±1.00 | 84.00 | +1.00 | 2.65 | within" in page
    assert "![the gaps](overview.png)" in page and "Text infilling (BART)" not in page
    assert (tmp_path / "docs" / "overview.png").read_bytes()[:4] == b"\x89PNG"


def test_a_grid_without_a_control_or_the_scale_is_one_line(capsys):
    assert overview.main(["configs/ablations/transformer_modifications.gin",
                          "--scale", "tiny"]) == 2
    assert capsys.readouterr().err == (
        "error: configs/ablations/transformer_modifications.gin has no control row at scale "
        "'tiny': the overview compares each table's rows with its random-init control\n")
    assert overview.main(["configs/ablations/transformer_modifications.gin"]) == 2
    assert capsys.readouterr().err.startswith("error: grid 'transformer_modifications' has no "
                                              "scale 'micro'; scales: [")


MICRO_GRIDS = [f"configs/ablations/{name}.gin" for name in
               ("t5_table2", "t5_table4", "t5_table5", "t5_table6", "t5_table7", "bert_table5",
                "bert_table6")]


def test_the_committed_micro_page_is_what_the_committed_cells_give(tmp_path, capsys):
    """docs/ablations/micro_overview.md, rendered again from runs/ablations: not stale."""
    pytest.importorskip("matplotlib")
    args = [*MICRO_GRIDS, "--render", "docs/ablations/micro_overview"]
    command = "python -m t2t.ablations.overview " + " ".join(args)
    page = overview.overview(MICRO_GRIDS, "micro", "runs/ablations",
                             str(tmp_path / "micro_overview"), command)
    with open("docs/ablations/micro_overview.md", encoding="utf-8") as f:
        assert f.read() == page, ("docs/ablations/micro_overview.md is stale: rerun "
                                  f"`{command}`")
    assert "**0 are above their control**" in page          # issue 22's finding at micro
