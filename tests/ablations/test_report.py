"""report.paper_orderings: every two rows the paper orders, against ours, with the paper's
own ties and our seed noise told apart."""
import pytest

from t2t.ablations import grid as grid_lib, report
from t2t.errors import ConfigError

SCALE = {"tiny": {"pretrain": [], "finetune": [], "tasks": {"t": "accuracy"},
                  "averages": {"Average": ["t"]}}}


def _grid(paper, columns=("GLUE",), **kw):
    return grid_lib.ablation(name="g", title="t", axes={"A": {k: [] for k in paper}},
                             scales=SCALE, paper=paper, paper_columns=list(columns), **kw)


def _results(scores):
    return {key: [{"seed": s, "pretrain": {}, "finetune": {"t": {"metrics": {"accuracy": v}}}}
                  for s, v in enumerate(values)] for key, values in scores.items()}


def test_pairs_hold_reverse_or_sit_in_the_noise_and_the_papers_ties_count_apart():
    grid = _grid({"a": [84.0], "b": [82.0], "c": [80.0], "d": [79.9]},
                 orderings={"Average": "GLUE"}, paper_sd={"GLUE": 0.235})
    # every row has variance 4 (values m-2, m, m+2): pooled sd 2, so 'holds' needs a gap > 4
    scores = _results({"a": [78, 80, 82], "b": [68, 70, 72], "c": [81, 83, 85],
                       "d": [71, 73, 75]})
    lines = report.paper_orderings(grid, scores)
    summary, table = lines[0], "\n".join(lines)
    # paper: a > b > c > d; d is within 2 x 0.235 of c (a tie there). Ours (means): a 80,
    # b 70, c 83, d 73. a>b +10 holds; a>c -3 noise (other way); a>d +7 holds; b>c -13
    # reversed; b>d -3 noise (other way); c>d +10 but a tie in the paper.
    assert "of 6 pairs the paper separates 5" in summary and "1 is a tie there" in summary
    assert "**2 hold**" in summary and "**1 is reversed**" in summary
    assert "2 are within our noise (0 of them in the paper's direction)" in summary
    assert "(our pooled seed sd: 2.00 over 4 rows)" in summary
    # Kendall: concordant a>b, a>d, c>d; discordant a>c, b>c, b>d -> (3 - 3) / 6
    assert "Kendall's τ between the two rankings +0.00" in summary
    assert "Among the pretrained rows" not in summary                # no control here
    assert "| b > c | +2.00 | -13.00 | -6.5 | **reversed** |" in table
    assert "| c > d | +0.10 | +10.00 | +5.0 | a tie in the paper |" in table
    assert table.index("| a > d |") < table.index("| a > b |")      # by the paper's gap


def test_each_column_ranks_its_own_way_and_a_scale_without_the_column_is_skipped():
    grid = _grid({"small": [6.0], "big": [4.0]}, columns=("LM (ppl)",),
                 orderings={"Average": "LM (ppl)"})
    lines = report.paper_orderings(grid, _results({"small": [70, 72], "big": [80, 82]}))
    assert "(Average: higher is better, LM (ppl): lower is better)" in lines[0]
    assert "| big > small | +2.00 | +10.00 | +7.1 | holds |" in "\n".join(lines)
    assert report.paper_orderings(_grid({"a": [1.0], "b": [2.0]},
                                        orderings={"GLUE": "GLUE"}), {}) == []
    unmeasured = report.paper_orderings(_grid({"a": [1.0], "b": [2.0]},
                                              orderings={"Average": "GLUE"}), {})
    assert "not yet measured" in unmeasured[0]


def test_the_papers_control_row_joins_the_orderings():
    grid = _grid({"a": [84.0], "b": [82.0]}, orderings={"Average": "GLUE"}, control="a",
                 paper_control=[66.0])
    assert grid.paper[grid_lib.CONTROL_LABEL] == [66.0]
    table = "\n".join(report.paper_orderings(grid, _results(
        {"a": [80, 82], "b": [70, 72], "random_init": [85, 87]})))
    assert "| a > Random init (control) | +18.00 | -5.00 | -3.5 | **reversed** |" in table
    # all three pairs: a > b holds, both against the control reversed; a and b alone: holds
    assert "**1 hold**" in table and "**2 are reversed**" in table
    alone = table.split("Among the pretrained rows alone (the control left out): ")[1]
    assert alone.startswith("of 1 pair the paper orders 1; here **1 hold**")
    assert "τ between the two rankings +1.00." in alone
    with pytest.raises(ConfigError, match="set ablation.control"):
        _grid({"a": [1.0]}, paper_control=[66.0])


def test_orderings_must_name_paper_columns():
    with pytest.raises(ConfigError, match=r"orderings names paper columns \['SQuAD'\]"):
        _grid({"a": [1.0]}, orderings={"Average": "SQuAD"})
    with pytest.raises(ConfigError, match=r"paper_sd names paper columns \['EnDe'\]"):
        _grid({"a": [1.0]}, paper_sd={"EnDe": 0.1})


def test_the_plot_adds_our_column_against_the_papers(tmp_path, monkeypatch):
    import matplotlib.figure
    from matplotlib.container import ErrorbarContainer
    grid = _grid({"a": [84.0], "b": [82.0], "c": [80.0]}, orderings={"Average": "GLUE"})
    drawn = []
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, path, **kw: drawn.append(fig))
    report.plot(grid, _results({"a": [80, 82], "b": [70, 72], "c": [75]}), str(tmp_path / "p"))
    (fig,) = drawn
    bars, paper, against = fig.axes[0], fig.axes[-2], fig.axes[-1]
    assert paper.get_title() == "paper: GLUE"
    assert against.get_title() == "ours against the paper (3 rows)"
    assert [t.get_text() for t in against.texts] == ["1", "2", "3"]   # numbered as the bars
    assert bars.get_xticklabels()[1].get_text() == "2. b"
    # c ran one seed: its bar is hatched and has no whisker (a range of 0 would claim one)
    assert [p.get_hatch() for p in bars.patches] == [None, None, "//"]
    (errorbar,) = [c for c in bars.containers if isinstance(c, ErrorbarContainer)]
    whiskers = errorbar.lines[2][0].get_segments()
    assert [len(w) for w in whiskers] == [2, 2, 0]                  # c's is not drawn
    hollow = [line.get_markerfacecolor() for line in against.lines if line.get_marker() == "o"]
    assert hollow[2] == "white" and hollow[0] != "white"
    drawn.clear()        # a wide range: the y axis shows every whisker whole, not just the means
    report.plot(grid, _results({"a": [80, 82], "b": [50, 92], "c": [75]}), str(tmp_path / "p"))
    low, high = drawn[0].axes[0].get_ylim()
    assert low < 50 and high > 92


def test_the_page_says_what_a_one_seed_bar_looks_like(tmp_path):
    grid = _grid({"a": [84.0], "b": [82.0]})
    def results(scores):
        out = _results(scores)
        for rows in out.values():
            for r in rows:
                r.update(hardware="1 x cpu", finished="2026-11-29T00:00:00", precision="float32")
                r["pretrain"] = dict(steps=1, tokens=8, flops=1.0, wall_s=1.0, cpu_s=1.0, params=2)
                r["finetune"]["t"].update(steps=1, flops=1.0, wall_s=1.0, cpu_s=1.0)
        return out
    caption = "a hatched bar (a hollow point) is a row with one seed"
    md, _ = report.render(grid, results({"a": [80, 82], "b": [70]}), str(tmp_path), "t2t ablate")
    assert caption in open(md).read()
    md, _ = report.render(grid, results({"a": [80, 82], "b": [70, 71]}), str(tmp_path), "t2t ablate")
    assert caption not in open(md).read()
    unscored = results({"a": [80, 82], "b": [70, 71]})   # b's second seed has no score: n=1
    unscored["b"][1]["finetune"]["t"]["metrics"] = {}
    md, _ = report.render(grid, unscored, str(tmp_path), "t2t ablate")
    assert caption in open(md).read()
