"""`t2t ablate` end to end on a two-cell grid of test-sized models: every stage runs, finished
stages are cached (a rerun trains nothing), a lost or reconfigured stage reruns, and the report
renders our numbers beside the paper's with the P/M accounting."""
import json
import os
import subprocess

import jax
import numpy as np
import pytest

import t2t
from t2t import storage
from t2t.ablations import grid as grid_lib, report, runner
from t2t.evaluation import unigram
from t2t.cli import main
from tests.data.helpers import write_offline_datasets

FAST = ["'TrainConfig.log_every = 1'", "'TrainConfig.progress_bar = False'",
        "'TrainConfig.async_checkpoint = False'", "'TrainConfig.measure_peak = False'",
        "'BATCH_SIZE = 8'", "'TRAIN_STEPS = 2'",
        "\"TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 16}\""]
GRID = f"""
MICRO = {{
    'pretrain': ['runs/pretrain.gin', 'hardware/cpu.gin', 'models/t5/1_1/test.gin',
                 'objectives/iid_15_u_u.gin', 'CORPUS = "bible_web"', {", ".join(FAST)}],
    'finetune': ['runs/finetune.gin', 'hardware/cpu.gin', 'models/t5/1_1/test.gin',
                 'evaluate_experiment.batch_size = 8', {", ".join(FAST)}],
    'tasks': {{'bible_style_kjv_to_web': 'bleu'}},
    'seeds': [0],
    'eval_examples': 8,
}}
ablation.name = 'micro'
ablation.title = 'Micro'
ablation.scales = {{'tiny': %MICRO}}
ablation.axes = {{'Architecture': {{
    'Encoder-decoder': [],
    'Prefix LM': ["MODEL_FAMILY = 'gpt'", "experiment.converter = 'prefix_lm'"]}}}}
ablation.accounting = {{'P': 'Prefix LM', 'M': 'Encoder-decoder'}}
ablation.paper_columns = ['GLUE']
ablation.paper = {{'Encoder-decoder': [83.28], 'Prefix LM': [81.82]}}
"""


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("ablate")
    path = root / "micro.gin"
    path.write_text(GRID)
    out, docs = root / "runs", root / "docs"
    main(["ablate", str(path), "--scale=tiny", f"--out_dir={out}", f"--docs_dir={docs}"])
    return grid_lib.load_grid(str(path), "tiny"), str(out), str(docs)


def test_every_cell_ran_every_stage(ran):
    grid, out, _ = ran
    results = runner.load_results(grid, out)
    for cell in grid.cells:
        (result,) = results[cell.key]
        pre, ft = result["pretrain"], result["finetune"]["bible_style_kjv_to_web"]
        assert pre["steps"] == 2 and pre["flops"] == 2 * pre["flops_per_step"] > 0
        assert ft["steps"] == 2 and 0.0 <= ft["metrics"]["bleu"] <= 100.0
        root = runner.cell_dir(out, grid, cell, 0)
        assert os.path.exists(os.path.join(root, "pretrain", "config.gin"))
    families = {k: r[0]["pretrain"]["family"] for k, r in results.items()}
    assert families == {"encoder_decoder": "t5", "prefix_lm": "gpt"}
    # which code produced the result: this checkout's commit
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=os.path.dirname(runner.__file__)).stdout.strip()
    want = f"t2t {t2t.__version__}" + (f" @ {commit}" if commit else "")   # a checkout or not
    assert results["encoder_decoder"][0]["code"].startswith(want)


def test_finished_stages_are_cached_and_a_lost_one_reruns_alone(ran, monkeypatch):
    from t2t.train import trainer as trainer_lib
    from t2t.run import finetune as finetune_lib
    grid, out, _ = ran
    real_fit = finetune_lib.fit

    def must_not_train(*args, **kwargs):
        raise AssertionError("a finished stage trained again")

    monkeypatch.setattr(trainer_lib, "fit", must_not_train)
    monkeypatch.setattr(finetune_lib, "fit", must_not_train)
    assert len(runner.run_grid(grid, out, grid.cells, [0])) == 2

    cell = grid.cells[0]
    root = runner.cell_dir(out, grid, cell, 0)
    stage_path = os.path.join(root, "finetune", "bible_style_kjv_to_web", "stage.json")
    os.remove(stage_path)
    trained = []

    def fit_once(*args, **kwargs):
        trained.append(1)
        return real_fit(*args, **kwargs)

    monkeypatch.setattr(finetune_lib, "fit", fit_once)
    result = runner.run_cell(grid, cell, 0, out, progress=lambda m: None)
    assert trained == [1] and os.path.exists(stage_path)
    assert result["finetune"]["bible_style_kjv_to_web"]["steps"] == 2


def test_a_stage_reruns_when_its_configuration_changed(tmp_path):
    stage_dir = str(tmp_path / "stage")
    said = []
    assert runner.reuse(stage_dir, "A", "sha-a", said.append) is None       # fresh: run it
    storage.write_json_atomically(os.path.join(stage_dir, "stage.json"), {"steps": 3})
    assert runner.reuse(stage_dir, "A", "sha-a", said.append) == {"steps": 3}
    assert said == []
    (tmp_path / "stage" / "checkpoints").mkdir()
    assert runner.reuse(stage_dir, "B", "sha-b", said.append) is None      # changed: cleared
    assert os.listdir(stage_dir) == ["config.sha256"] and len(said) == 1
    # a stage written before fingerprints: adopted when its config.gin is the operative one
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "config.gin").write_text("A")
    storage.write_json_atomically(str(legacy / "stage.json"), {"steps": 5})
    assert runner.reuse(str(legacy), "A", "sha-a", said.append) == {"steps": 5}
    assert runner.reuse(str(legacy), "A2", "sha-a2", said.append) is None


def test_another_grids_identical_stages_are_copied_not_rerun(ran, tmp_path, monkeypatch):
    """A second grid whose cell pretrains and fine-tunes exactly as a finished one (T5
    Tables 5-7's baseline is Table 2's) copies both stages; a different cell trains."""
    from t2t.train import trainer as trainer_lib
    from t2t.run import finetune as finetune_lib
    _, out, _ = ran
    path = tmp_path / "micro2.gin"
    path.write_text(GRID.replace("'micro'", "'micro2'").replace(
        "'Prefix LM': [\"MODEL_FAMILY = 'gpt'\", \"experiment.converter = 'prefix_lm'\"]",
        "'Wide': ['TransformerConfig.d_ff = 96']").replace(
        "'Prefix LM': [81.82]", "'Wide': [0.0]").replace("'P': 'Prefix LM'", "'P': 'Wide'"))
    grid = grid_lib.load_grid(str(path), "tiny")
    same, wide = grid.cells
    for module in (trainer_lib, finetune_lib):
        monkeypatch.setattr(module, "fit", lambda *a, **k: pytest.fail("trained again"))
    twin = os.path.join(out, "micro", "tiny", "encoder_decoder", "seed0")
    tuning = os.path.join("finetune", "bible_style_kjv_to_web")
    # --list's plan, read before anything runs: the same cell copies both stages, Wide trains
    assert runner.plan_cell(grid, same, 0, out) == {
        "pretrain": os.path.join(twin, "pretrain"), tuning: os.path.join(twin, tuning)}
    assert runner.plan_cell(grid, wide, 0, out) == dict.fromkeys(["pretrain", tuning])
    listed = report.status(grid, {}, grid.cells, [0], {
        (c.key, 0): runner.plan_cell(grid, c, 0, out) for c in grid.cells}, {})
    assert "to run: –; copies: 0 (micro/encoder_decoder)" in listed.splitlines()[0]
    assert listed.splitlines()[-1] == ("0 of 2 cell-seeds finished, 1 to run, 1 to copy from "
                                       "finished stages")
    said = []
    twin_result = os.path.join(twin, "result.json")
    original = open(twin_result).read()
    storage.write_json_atomically(twin_result, {**json.loads(original), "hardware": "elsewhere",
                                                "finished": "2000-01-01T00:00:00+00:00"})
    try:
        result = runner.run_cell(grid, same, 0, out, said.append)
        ran_there = json.load(open(twin_result))
    finally:
        open(twin_result, "w").write(original)
    assert result["pretrain"]["copied_from"] == os.path.join(twin, "pretrain")
    tuned = result["finetune"]["bible_style_kjv_to_web"]
    assert tuned["copied_from"] == os.path.join(twin, "finetune", "bible_style_kjv_to_web")
    assert tuned["metrics"] == ran_there["finetune"]["bible_style_kjv_to_web"]["metrics"]
    where = ("hardware", "code", "finished")      # a copied row says where and when it ran
    assert {k: result[k] for k in where} == {k: ran_there[k] for k in where}
    assert result["finished"].startswith("2000-01-01") and result["hardware"] == "elsewhere"
    assert sum("copying" in m for m in said) == 2
    model_dir = runner.pretrain_dir(out, grid, same, 0)
    assert os.listdir(os.path.join(model_dir, "checkpoints")) == ["2"]
    assert model_dir in open(os.path.join(model_dir, "config.gin")).read()
    assert runner.run_cell(grid, same, 0, out, said.append) == result    # cached now
    assert runner.plan_cell(grid, same, 0, out) == dict.fromkeys(["pretrain", tuning],
                                                                 runner.FINISHED)
    assert report._copied([result["pretrain"]]) == report._copied([tuned]) == " (ran in micro)"
    with pytest.raises(pytest.fail.Exception, match="trained again"):
        runner.run_cell(grid, wide, 0, out, said.append)
    # gin wraps a long directory onto the next line(s); the comparison ignores the binding
    short = "MODEL_DIR = 'a/b'\nX = 1\n"
    wrapped = "MODEL_DIR = \\\n    ('a/very/long/'\n     'b')\nX = 1\n"
    assert runner._without_dirs(short) == runner._without_dirs(wrapped)
    assert runner._without_dirs(short) != runner._without_dirs(short.replace("1", "2"))


def _as_if_run_on_another_host(grid, stages, other, why="another CPU"):
    """Rewrite a finished cell's stages (pretraining, then its fine-tuning) as if 'auto' had
    resolved to `other` on their host (because of `why`), each under the fingerprint it
    would have had there."""
    upstream = ""
    for stage in stages:
        theirs = runner._PRECISION_NOTE.sub(
            f"# TransformerConfig.dtype 'auto' resolved to '{other}' on this host: "
            f"{other} ({why}).", open(os.path.join(stage, "config.gin")).read())
        assert runner.stage_precision(theirs) == other
        open(os.path.join(stage, "config.gin"), "w").write(theirs)
        sha = runner.fingerprint(theirs, upstream)
        open(os.path.join(stage, "config.sha256"), "w").write(sha)
        upstream = f"{sha} {grid.scale.split_of('bible_style_kjv_to_web')} 8"


def test_another_grids_stages_from_another_kind_of_host_are_copied(ran, tmp_path):
    """T5 Tables 5-7 copy Table 2's baseline when it ran in our precision on another kind
    of host (float32 on an AVX2-only CPU, here an AVX-512 one), not when it ran in another
    (a bfloat16 learning curve beside a float32 table), nor with any other difference."""
    import shutil
    from t2t import precision
    grid, out, _ = ran
    here = precision.resolve_dtype("auto")
    cell = grid.cells[0]
    root = runner.cell_dir(out, grid, cell, 0)
    tuning = os.path.join("finetune", "bible_style_kjv_to_web")
    stages = [runner.pretrain_dir(out, grid, cell, 0), os.path.join(root, tuning)]
    path = tmp_path / "micro3.gin"
    path.write_text(GRID.replace("'micro'", "'micro3'"))
    copier = grid_lib.load_grid(str(path), "tiny")
    same = copier.cells[0]
    backup = str(tmp_path / "backup")
    shutil.copytree(root, backup)
    try:
        _as_if_run_on_another_host(grid, stages, here, why="some other CPU's flags")
        assert runner.plan_cell(copier, same, 0, out) == {
            "pretrain": stages[0], tuning: stages[1]}
        _as_if_run_on_another_host(grid, stages, "float16")
        plan = runner.plan_cell(copier, same, 0, out)
        assert plan["pretrain"] != stages[0] and plan[tuning] != stages[1]
        _as_if_run_on_another_host(grid, stages, here)
        with open(os.path.join(stages[0], "config.gin"), "a") as f:
            f.write("\nTRAIN_STEPS = 3\n")        # now another configuration: trains here
        text = open(os.path.join(stages[0], "config.gin")).read()
        open(os.path.join(stages[0], "config.sha256"), "w").write(runner.fingerprint(text))
        plan = runner.plan_cell(copier, same, 0, out)
        assert plan["pretrain"] != stages[0] and plan[tuning] != stages[1]
    finally:
        shutil.rmtree(root)
        shutil.copytree(backup, root)


def test_a_stage_run_on_another_kind_of_host_stands_as_it_ran(ran, tmp_path, monkeypatch):
    """A finished stage whose config differs from ours only in what dtype 'auto' resolved to
    (bfloat16 on an AMX host, float32 on an AVX2-only one) is kept under its own fingerprint,
    so its fine-tunings are too and the cell is not rerun; one that stopped there is an error
    naming both precisions; any other difference still clears and reruns the stage."""
    import shutil
    from t2t import precision
    from t2t.errors import ConfigError
    from t2t.train import trainer as trainer_lib
    from t2t.run import finetune as finetune_lib
    grid, out, _ = ran
    here = precision.resolve_dtype("auto")
    other = "float32" if here == "bfloat16" else "bfloat16"
    cell = grid.cells[0]
    root = runner.cell_dir(out, grid, cell, 0)
    backup = str(tmp_path / "backup")
    shutil.copytree(root, backup)
    stages = [runner.pretrain_dir(out, grid, cell, 0),
              os.path.join(root, "finetune", "bible_style_kjv_to_web")]
    for module in (trainer_lib, finetune_lib):
        monkeypatch.setattr(module, "fit", lambda *a, **k: pytest.fail("trained again"))
    try:
        _as_if_run_on_another_host(grid, stages, other)
        before = {s: sorted(os.listdir(s)) for s in stages}
        os.remove(os.path.join(root, "result.json"))
        result = runner.run_cell(grid, cell, 0, out, print)        # nothing trains
        assert result["precision"] == other
        assert {s: sorted(os.listdir(s)) for s in stages} == before
        assert "checkpoints" in before[stages[0]]
        # a stage that stopped on the other kind of host is not resumed in another precision
        os.remove(os.path.join(stages[0], "stage.json"))
        with pytest.raises(ConfigError, match=f"stopped on another kind of host, where dtype "
                                              f"'auto' meant {other} \\(another CPU\\); here "
                                              f"it means {here}"):
            runner.run_cell(grid, cell, 0, out, print)
        assert "checkpoints" in os.listdir(stages[0])
    finally:
        shutil.rmtree(root)
        shutil.copytree(backup, root)
    # another difference as well: a changed configuration, cleared and rerun as before
    kept = tmp_path / "kept"
    shutil.copytree(backup + "/finetune/bible_style_kjv_to_web", kept)
    ours = (kept / "config.gin").read_text()
    theirs = runner._PRECISION_NOTE.sub(
        f"# TransformerConfig.dtype 'auto' resolved to '{other}' on this host: x.", ours)
    (kept / "config.gin").write_text(theirs + "\nTRAIN_STEPS = 3\n")
    (kept / "config.sha256").write_text(runner.fingerprint(theirs + "\nTRAIN_STEPS = 3\n"))
    assert runner.ran_as_this(str(kept), ours) is None
    assert runner.reuse(str(kept), ours, runner.fingerprint(ours), print) is None   # cleared
    assert os.listdir(kept) == ["config.sha256"]


def test_the_compute_table_says_which_precision_each_seed_ran_in(ran):
    from t2t import precision
    grid, out, docs = ran
    results = runner.load_results(grid, out)
    here = precision.resolve_dtype("auto")
    assert {r["precision"] for rs in results.values() for r in rs} == {here}
    header = next(line for line in open(os.path.join(docs, "micro_tiny.md"))
                  if line.startswith("| cell |"))
    assert header.split(" | ")[:3] == ["| cell", "seeds", "precision"]
    assert f"| Prefix LM | 1 | {here} |" in report.compute_table(grid, results)
    mixed = [{"seed": 2, "precision": "float32"}, {"seed": 0, "precision": "bfloat16"},
             {"seed": 1, "precision": "bfloat16"}]
    assert report.precisions(mixed) == "bfloat16 (0, 1), float32 (2)"
    assert report.precisions(mixed[1:]) == "bfloat16"


def test_list_says_which_seeds_finished_and_what_the_rest_should_cost(ran, capsys):
    from t2t import precision
    grid, out, _ = ran
    here = precision.resolve_dtype("auto")
    results = runner.load_results(grid, out)
    plans = {(c.key, 1): runner.plan_cell(grid, c, 1, out) for c in grid.cells}
    assert all(set(plan.values()) == {None} for plan in plans.values())     # seed 1 trains
    costs = runner.stage_cpu_seconds(out, grid)
    assert sorted(costs) == ["finetune/bible_style_kjv_to_web", "pretrain"]
    text = report.status(grid, results, grid.cells, [0, 1], plans, costs)
    lines = text.splitlines()
    assert lines[0].startswith("encoder_decoder") and "Encoder-decoder" in lines[0]
    assert f"finished: 0 ({here})" in lines[0] and lines[0].endswith("to run: 1")
    cpu = [sum(st["cpu_s"] for st in [r["pretrain"], *r["finetune"].values()])
           for rs in results.values() for r in rs]
    minutes = sum(cpu) / 60          # seed 1 of both cells at their stages' mean: the same sum
    assert lines[-1] == (f"2 of 4 cell-seeds finished, 2 to run: about {minutes:.0f} "
                         "CPU-minutes at the mean CPU time of this grid's stages that trained "
                         "here")
    assert report.status(grid, results, grid.cells, [0], {}, costs).splitlines()[-1] == \
        "2 of 2 cell-seeds finished, 0 to run"
    main(["ablate", grid.source, "--scale=tiny", f"--out_dir={out}", "--list"])
    assert capsys.readouterr().out.strip() == report.status(grid, results, grid.cells, [0],
                                                            {}, costs).strip()


def test_list_reruns_a_seed_that_finished_under_an_earlier_recipe(ran, tmp_path, capsys):
    """A scale's fine-tuning recipe changed after seed 0 finished: --list no longer counts
    that seed as finished (its table row would mix recipes) and says why it runs again."""
    grid, out, _ = ran
    changed = tmp_path / "micro.gin"
    changed.write_text(GRID.replace("'evaluate_experiment.batch_size = 8'",
                                    "'evaluate_experiment.batch_size = 8', "
                                    "'TrainConfig.keep_checkpoints = 2'"))
    main(["ablate", str(changed), "--scale=tiny", f"--out_dir={out}", "--list"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines[:2]] == ["encoder_decoder", "prefix_lm"]
    for line in lines[:2]:
        assert "finished: –" in line
        assert line.endswith("to run: 0 (0: finished under an earlier configuration)"), line
    assert lines[-1].startswith("0 of 2 cell-seeds finished, 2 to run")
    main(["ablate", grid.source, "--scale=tiny", f"--out_dir={out}", "--list"])
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        "2 of 2 cell-seeds finished, 0 to run"


def test_each_stage_records_the_vocabulary_file_it_used(ran):
    """Trained vocabularies are named by a digest of their corpus: a stage says which."""
    from t2t.data import tasks
    grid, out, _ = ran
    results = runner.load_results(grid, out)
    vocab = tasks.get_task("bible_style_kjv_to_web").vocabulary
    name = os.path.basename(vocab.model_file)
    stages = [s for rs in results.values() for r in rs
              for s in [r["pretrain"], *r["finetune"].values()]]
    assert {s["vocabulary"] for s in stages} == {name}
    assert report.vocabulary_counts(grid, [r for rs in results.values() for r in rs]) == {
        name: len(stages)}


def test_report_puts_our_numbers_beside_the_papers(ran):
    grid, out, docs = ran
    md = open(os.path.join(docs, "micro_tiny.md")).read()
    assert os.path.getsize(os.path.join(docs, "micro_tiny.png")) > 1000
    rows = {}                      # the results table's rows (the compute table comes later)
    for line in md.splitlines():
        if line.startswith("| Encoder-decoder") or line.startswith("| Prefix LM"):
            rows.setdefault(line.split(" | ")[0].strip("| "), line.split(" | "))
    # Architecture | seeds | Params | Cost | bleu | paper: GLUE
    assert rows["Prefix LM"][1] == "0" and rows["Prefix LM"][2] == "1.00P"
    assert rows["Encoder-decoder"][3] == "1.00M"
    assert float(rows["Encoder-decoder"][2].rstrip("P")) > 1.5      # two stacks: ~2P
    assert rows["Encoder-decoder"][-1].strip(" |") == "83.28"
    assert "## Compute" in md
    assert f"t2t ablate {grid.source} --scale=tiny --out_dir={out}" in md   # the command ran


def test_list_counts_a_pretraining_two_cells_share_once(tmp_path):
    """BERT Table 5's LTR rows share one pretraining: --list's plan trains it in the first
    cell and names its directory in the second, which then costs only its fine-tunings."""
    path = tmp_path / "shared.gin"
    path.write_text(GRID.replace(
        "'Prefix LM': [\"MODEL_FAMILY = 'gpt'\", \"experiment.converter = 'prefix_lm'\"]",
        "'Other head': {'finetune': ['TrainConfig.log_every = 2']}").replace(
        "'Prefix LM': [81.82]", "'Other head': [0.0]").replace("'P': 'Prefix LM'",
                                                                "'P': 'Other head'"))
    grid = grid_lib.load_grid(str(path), "tiny")
    first, second = grid.cells
    out = str(tmp_path / "runs")
    plans = runner.plan_grid(grid, grid.cells, [0], out)
    tuning = os.path.join("finetune", "bible_style_kjv_to_web")
    assert plans[first.key, 0] == dict.fromkeys(["pretrain", tuning])
    assert plans[second.key, 0] == {"pretrain": runner.pretrain_dir(out, grid, first, 0),
                                    tuning: None}
    costs = {"pretrain": [600.0], tuning: [60.0]}
    assert report.status(grid, {}, grid.cells, [0], plans, costs).splitlines()[-1] == (
        "0 of 2 cell-seeds finished, 2 to run: about 12 CPU-minutes at the mean CPU time of "
        "this grid's stages that trained here")
    assert runner.plan_grid(grid, [second], [0], out) == {       # selected alone: it
        (second.key, 0): dict.fromkeys(["pretrain", tuning])}          # trains the pretraining


def test_summaries_and_shards():
    assert report.summarize([1.0, None, 3.0]) == (2.0, 1.0, 2)
    assert report.summarize([None]) is None
    assert report._fmt((2.0, 1.0, 2), seeds=2) == "2.00 ±1.00"
    assert report._fmt((2.0, 0.0, 1), seeds=2) == "2.00 (n=1)"
    assert runner.shard(list(range(7)), "1/3") == [1, 4]
    with pytest.raises(ValueError, match="i/n"):
        runner.shard([1], "1-3")


def test_average_columns_need_every_task_of_their_group():
    grid = grid_lib.ablation(
        name="g", title="G", axes={"A": {"x": []}},
        scales={"tiny": {"pretrain": [], "finetune": [], "tasks": {"a": "accuracy", "b": "f1",
                                                                     "c": "bleu"},
                         "averages": {"GLUE": ["a", "b"]}}})
    cols = dict(report.columns(grid))
    assert list(cols) == ["GLUE", "c bleu"]
    result = {"finetune": {"a": {"metrics": {"accuracy": 80.0}}, "b": {"metrics": {"f1": 60.0}},
                           "c": {"metrics": {"bleu": 20.0}}}}
    assert cols["GLUE"](result) == 70.0 and cols["c bleu"](result) == 20.0
    del result["finetune"]["b"]
    assert cols["GLUE"](result) is None
    every = grid_lib.ablation(
        name="g", title="G", axes={"A": {"x": []}},
        scales={"tiny": {"pretrain": [], "finetune": [], "tasks": {"a": "accuracy", "b": "f1"},
                         "averages": {"Average": ["a", "b"]}, "task_columns": True}})
    assert [h for h, _ in report.columns(every)] == ["Average", "a accuracy", "b f1"]
    with pytest.raises(ValueError, match="averages or task_finetune name tasks not in"):
        grid_lib.make_scale("s", {"pretrain": [], "finetune": [], "tasks": {"a": "x"},
                                  "averages": {"G": ["z"]}})


def test_without_matplotlib_ablate_stops_before_any_cell(tmp_path, monkeypatch, capsys):
    import sys
    monkeypatch.setitem(sys.modules, "matplotlib", None)     # `import matplotlib` fails
    path = tmp_path / "micro.gin"
    path.write_text(GRID)
    code = main(["ablate", str(path), "--scale=tiny", f"--out_dir={tmp_path / 'runs'}",
                 f"--docs_dir={tmp_path / 'docs'}"])
    assert code == 2 and not (tmp_path / "runs").exists()
    assert "t2t ablate draws each table's chart with matplotlib, which is not installed: " \
           "pip install 't2t[plots]'" in capsys.readouterr().err


def test_a_preempted_stage_stops_the_grid_with_exit_75(tmp_path, monkeypatch):
    """SIGTERM during a cell saves that stage and stops `t2t ablate` (no later cell starts,
    nothing is rendered); exit 75 as `t2t train`."""
    calls = []

    def preempted(grid, cell, seed, out_dir, progress=print):
        calls.append(cell.key)
        return {"stopped_by": "preempted"}
    monkeypatch.setattr(runner, "run_cell", preempted)
    path = tmp_path / "micro.gin"
    path.write_text(GRID)
    code = main(["ablate", str(path), "--scale=tiny", f"--out_dir={tmp_path / 'runs'}",
                 f"--docs_dir={tmp_path / 'docs'}"])
    assert code == 75 and len(calls) == 1 and not (tmp_path / "docs").exists()


@pytest.mark.slow    # ~26 s; the held-out scorer: test_heldout_scorer_is_two_evaluations_in_one_forward_pass
def test_the_early_held_out_score_splits_pretraining_without_changing_it(ran, tmp_path,
                                                                         monkeypatch):
    """`heldout_early`: the stage trains to that step, scores the held-out task, resumes to
    the end (the same final loss as the uninterrupted cell), and records both scores with
    their CPU seconds; the report gets an early column."""
    grid_text = GRID.replace("'eval_examples': 8,", "'eval_examples': 8, 'heldout_early': 1, "
                             "'heldout': ['bible_web_span_corruption_validation', 'loss'],")
    path = tmp_path / "micro.gin"
    path.write_text(grid_text)
    out = tmp_path / "runs"
    grid = grid_lib.load_grid(str(path), "tiny")
    cell = grid.cells[0]
    monkeypatch.setattr(unigram, "TRAIN_BATCHES", 4)
    pre, _ = runner.pretrain(grid, cell, 0, runner.pretrain_dir(str(out), grid, cell, 0))
    early, final = pre["heldout_early"], pre["heldout"]
    # the floor: the held-out targets scored by 4 training batches' target frequencies
    assert final["unigram"]["train_targets"] > 4 * 8 and 1.0 < final["unigram"]["loss"] < 9.1
    assert early["step"] == 1 and pre["steps"] == 2 and early["loss"] != final["loss"]
    assert min(early["cpu_s"], final["cpu_s"], pre["cpu_s"]) > 0
    plain = runner.load_results(ran[0], ran[1])[cell.key][0]["pretrain"]
    assert pre["final_loss"] == pytest.approx(plain["final_loss"], abs=1e-6)
    assert [c for c, _ in report.columns(grid)][:2] == ["held-out ppl at 1", "held-out ppl"]
    results = runner.load_results(ran[0], ran[1])
    table = report.compute_table(ran[0], results)
    assert all(line.endswith(" s |") for line in table.splitlines()[2:])   # CPU seconds
    # a task that has left the scale (its stage still in older results) is not counted
    stale = {k: [{**r, "finetune": {**r["finetune"], "dropped_task": {
        "steps": 1000, "flops": 1e15, "wall_s": 1e4, "eval_s": 0.0, "cpu_s": 1e4}}}
        for r in found] for k, found in results.items()}
    assert report.compute_table(ran[0], stale) == table


CURVE = GRID.replace("'TRAIN_STEPS = 2'", "'TRAIN_STEPS = 2', 'TrainConfig.checkpoint_every = 1', "
                     "'TrainConfig.keep_checkpoints = 2'").split("ablation.name")[0] + """
ablation.name = 'curve'
ablation.title = 'Curve'
ablation.scales = {'tiny': %MICRO}
ablation.axes = {'Pretraining': {'1 step': {'key': 'step1', 'from_step': 1}, '2 steps': []}}
ablation.control = '2 steps'
"""


def test_a_control_row_and_a_learning_curve_share_one_pretraining(tmp_path):
    from t2t.train.checkpoints import restore_params
    path = tmp_path / "curve.gin"
    path.write_text(CURVE)
    out, docs = tmp_path / "runs", tmp_path / "docs"
    main(["ablate", str(path), "--scale=tiny", f"--out_dir={out}", f"--docs_dir={docs}"])
    grid = grid_lib.load_grid(str(path), "tiny")
    assert [c.label for c in grid.cells] == ["1 step", "2 steps", "Random init (control)"]
    results = runner.load_results(grid, str(out))
    control = results["random_init"][0]
    assert control["pretrain"]["random_init"] and control["pretrain"]["steps"] == 0
    ft_config = os.path.join(runner.cell_dir(str(out), grid, grid.cells[2], 0), "finetune",
                             "bible_style_kjv_to_web", "config.gin")
    assert "INITIAL_CHECKPOINT = None" in open(ft_config).read()
    # one pretraining (the first cell's) serves the curve; step 1 is not the last step's
    pre = runner.pretrain_dir(str(out), grid, grid.cells[1], 0)
    assert pre == runner.pretrain_dir(str(out), grid, grid.cells[0], 0)
    assert pre == os.path.join(runner.cell_dir(str(out), grid, grid.cells[0], 0), "pretrain")
    assert results["step1"][0]["from_step"] == 1
    step_one = restore_params(os.path.join(pre, "checkpoints", "1"))
    for a, b in zip(jax.tree.leaves(step_one), jax.tree.leaves(restore_params(pre, step=1))):
        np.testing.assert_array_equal(a, b)
    assert any((a != b).any() for a, b in zip(jax.tree.leaves(step_one),
                                             jax.tree.leaves(restore_params(pre))))
    md = open(os.path.join(docs, "curve_tiny.md")).read()
    assert "| Random init (control) | 0 |" in md and "Does pretraining matter here?" in md
    assert "2 steps" in md.split("Does pretraining matter here?")[1]
    # another grid's identical control row is copied, not run again; so is its full
    # pretraining's fine-tuning, though it sits in the curve's second cell, not beside the
    # pretraining (there: step 1's)
    other = tmp_path / "other.gin"
    other.write_text(CURVE.replace("ablation.name = 'curve'", "ablation.name = 'other'")
                     .replace("'1 step': {'key': 'step1', 'from_step': 1}, ", ""))
    other_grid = grid_lib.load_grid(str(other), "tiny")
    tuning = os.path.join("finetune", "bible_style_kjv_to_web")
    control = runner.plan_cell(other_grid, other_grid.cells[1], 0, str(out))
    assert control == {tuning: os.path.join(runner.cell_dir(str(out), grid, grid.cells[2], 0),
                                            tuning)}
    main(["ablate", str(other), "--scale=tiny", f"--out_dir={out}", f"--docs_dir={docs}"])
    copied = runner.load_results(grid_lib.load_grid(str(other), "tiny"), str(out))
    for key in ("random_init", "2_steps"):
        stage = copied[key][0]["finetune"]["bible_style_kjv_to_web"]
        assert os.path.join("curve", "tiny", key) in stage["copied_from"]
        assert stage["metrics"] == results[key][0]["finetune"]["bible_style_kjv_to_web"][
            "metrics"]
    # a step the pretraining did not keep is one line naming what it kept
    with pytest.raises(ValueError, match=r"kept checkpoints \[1, 2\]"):
        runner.initial_checkpoint(grid_lib.Cell("x", (), (), (), from_step=3), pre)


def test_the_control_margin_is_against_twice_the_pooled_seed_sd():
    grid = grid_lib.ablation(
        name="g", title="t", axes={"A": {"base": [], "other": []}},
        scales={"tiny": {"pretrain": [], "finetune": [], "tasks": {"t": "accuracy"}}},
        control="base")
    def res(seed, acc):
        return {"seed": seed, "pretrain": {}, "finetune": {"t": {"metrics": {"accuracy": acc}}}}
    results = {"base": [res(0, 80.0), res(1, 82.0), res(2, 84.0)],     # variance 4
               "other": [res(0, 70.0), res(1, 76.0)],                  # variance 18
               "random_init": [res(0, 70.0), res(1, 72.0), res(2, 74.0)]}   # variance 4
    (line,) = report.control_margins(grid, results)
    # pooled sd = sqrt((4 + 18 + 4) / 3) = 2.94; margin 82 - 72 = 10 > 5.89
    assert "**+10.00**" in line and "sd 2.94 over 3 rows" in line and "**met**" in line
    results["base"] = [res(0, 74.0), res(1, 76.0), res(2, 78.0)]
    assert "**not met**" in report.control_margins(grid, results)[0]



def test_the_checkpoint_curve_scores_each_kept_step_against_the_unigram_floor(ran, monkeypatch):
    import math

    from t2t.ablations import checkpoint_curve
    grid, out, _ = ran
    pre_dir = runner.pretrain_dir(out, grid, grid.cells[0], 0)
    monkeypatch.setattr(unigram, "TRAIN_BATCHES", 8)
    init, last = checkpoint_curve.run_curve(pre_dir, batches=2, probe_examples=60,
                                            probe_task="bible_paraphrase_kjv_web")
    assert (init["step"], last["step"]) == (0, 2) and last["heldout_batches"] == 2
    # the initialisation knows nothing (no better than uniform over the 8,192 ids, worse
    # than the floor); two steps already learn the frequent targets
    assert init["loss"] > math.log(8192) - 0.1 and init["loss"] > init["unigram_loss"]
    assert last["loss"] < init["loss"]
    # the sentinels and EOS are the frequent, easy targets: for the floor and the model alike
    assert last["content_unigram_loss"] > last["unigram_loss"]
    assert last["content_loss"] > last["loss"]
    # the frozen encoder probe: the paraphrase task's two labels, on 60 examples a split
    assert 0.0 <= last["probe_accuracy"] <= 100.0 and -1.0 <= last["mean_cosine"] <= 1.0
    assert round(last["probe_accuracy"] * 60 / 100, 6).is_integer()


def test_heldout_scorer_is_two_evaluations_in_one_forward_pass(ran):
    import itertools

    from t2t.ablations import checkpoint_curve
    from t2t.train import partitioning
    grid, out, _ = ran
    exp = checkpoint_curve.load_experiment(runner.pretrain_dir(out, grid, grid.cells[0], 0))
    heldout = list(itertools.islice(exp.eval_data(), 2))
    params = exp.trainer.init_state(heldout[0]).params
    vocab = exp.eval_task.vocabulary
    content = [checkpoint_curve.content_only(b, vocab) for b in heldout]
    scorer = checkpoint_curve.HeldoutScorer(exp.trainer, heldout, content)
    want = (exp.trainer.evaluate(params, iter(heldout), steps=None)["loss"],
            exp.trainer.evaluate(params, iter(content), steps=None)["loss"])
    np.testing.assert_allclose(scorer.score(params), want, rtol=1e-6)
    # one forward pass: the scorer's program has as many matmuls as one evaluation step's
    with partitioning.sharding_context(exp.trainer.mesh, exp.trainer.rules):
        one_step = exp.trainer._eval_step.lower(params, exp.trainer.global_batch(heldout[0]))
    dots = [text.count(" dot(") for text in (scorer.lowered(params).compile().as_text(),
                                             one_step.compile().as_text())]
    assert dots[0] == dots[1] > 0, dots


def test_compare_puts_two_runs_of_a_cell_side_by_side_seed_by_seed(ran, tmp_path, capsys):
    """`python -m t2t.ablations.compare A B`: the scale's columns for each common seed, A,
    B and B − A, their mean, and what each side ran on; a bad directory is one line."""
    import shutil
    from t2t import precision
    from t2t.ablations import compare
    grid, out, _ = ran
    a = os.path.dirname(runner.cell_dir(out, grid, grid.cells[0], 0))
    b = str(tmp_path / "rerun")
    shutil.copytree(a, b)
    result = json.load(open(os.path.join(b, "seed0", "result.json")))
    bleu = result["finetune"]["bible_style_kjv_to_web"]["metrics"]["bleu"]
    result["finetune"]["bible_style_kjv_to_web"]["metrics"]["bleu"] = bleu + 1.5
    storage.write_json_atomically(os.path.join(b, "seed0", "result.json"), result)
    text = compare.compare(a, b, grid.source)
    loss = result["pretrain"]["final_loss"]
    assert f"| 0 | {bleu:.2f} / {bleu + 1.5:.2f} / +1.50 | {loss:.2f} / {loss:.2f} / +0.00 |" \
        in text
    assert "| mean ± sd of B − A | +1.50 (n=1) | +0.00 (n=1) |" in text
    vocab = result["pretrain"]["vocabulary"]
    assert text.count(f"precision {precision.resolve_dtype('auto')}; vocabulary {vocab}") == 2
    assert text.count("code t2t ") == 2
    assert compare.main([a, str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("name", ["t5_table2", "bert_table5"])
def test_planning_parses_each_file_list_once_with_the_same_configs(name, tmp_path, monkeypatch):
    """`--list` reuses each stage's parsed files across cells and seeds (gin_utils.
    reuse_file_parses): every stage's operative config and fingerprint stay what parsing it
    from nothing gives, with no binding of an earlier cell left behind. (BERT Table 5's tiny
    tasks are BBC and spam: tiny stand-ins of the built datasets.)"""
    from t2t.run import gin_utils
    (tmp_path / "data").mkdir()
    monkeypatch.setenv("T2T_DATA_DIR", str(write_offline_datasets(tmp_path / "data")))
    grid = grid_lib.load_grid(os.path.join(os.path.dirname(t2t.__file__), "configs",
                                           "ablations", f"{name}.gin"), "tiny")
    task = grid.scale.tasks[0][0]

    def configs():
        found = []
        for seed in (0, 1):
            for cell in grid.cells:
                model_dir = str(tmp_path / cell.key / str(seed))
                if cell.pretrained:
                    found.append(runner._pretrain_config(grid, cell, seed, model_dir)[1:])
                found.append(runner._finetune_config(grid, cell, seed, task, model_dir,
                                                     model_dir, "sha")[1:])
        return found

    fresh = configs()
    with gin_utils.reuse_file_parses():
        reused = configs()
        assert gin_utils._FILE_PARSES          # the file lists were kept
    assert fresh and reused == fresh


def test_a_stage_from_before_new_transformer_fields_is_not_stale(tmp_path):
    """An older t2t's operative config lacks the TransformerConfig fields added since; at
    their defaults they change nothing, so the finished stage keeps its fingerprint (and
    is not cleared and rerun); a new field bound otherwise, or any other new line, is a
    changed configuration."""
    ours = ("TRAIN_STEPS = 3\nTransformerConfig.attention_pattern = 'dense'\n"
            "TransformerConfig.attention_window = (512,)\nTransformerConfig.d_model = 16\n"
            "TransformerConfig.funnel_blocks = ()\n")
    old = "TRAIN_STEPS = 3\nTransformerConfig.d_model = 16\nTransformerConfig.funnel_blocks = ()\n"
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "config.gin").write_text(old)
    (stage / "config.sha256").write_text(runner.fingerprint(old, "up"))
    (stage / "stage.json").write_text("{}")
    assert runner.ran_as_this(str(stage), ours, "up") == runner.fingerprint(old, "up")
    assert runner.stage_fingerprint(str(stage), ours, "up") == runner.fingerprint(old, "up")
    assert runner.ran_as_this(str(stage), ours, "another upstream") is None
    for changed in (ours.replace("'dense'", "'block_sparse'"),          # not the default
                    ours.replace("(512,)", "(256,)"),
                    ours.replace("d_model = 16", "d_model = 32"),        # a field it had
                    ours + "NEW_MACRO = 1\n"):                          # not a field
        assert runner.ran_as_this(str(stage), changed, "up") is None, changed
    assert runner.reuse(str(stage), ours, runner.stage_fingerprint(str(stage), ours, "up"),
                        print) == {}                                    # kept, not cleared
