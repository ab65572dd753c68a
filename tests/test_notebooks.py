"""notebooks/: every notebook runs from its jupytext .py without an error at the CI settings
(T2T_NOTEBOOK_CI=1), shows what it promises, and its committed .ipynb matches the .py."""
import importlib.util
import re
from pathlib import Path

import nbformat
import pytest

from tests.tiers import sweep

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "notebooks"
_spec = importlib.util.spec_from_file_location("notebooks_execute", DIR / "execute.py")
execute = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(execute)


def _outputs(nb, kind):
    """Every output of `kind` ("text": stream text and text/plain; a MIME type otherwise)."""
    found = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if kind == "text":
                found.append(out.get("text", "") + out.get("data", {}).get("text/plain", ""))
            elif kind in out.get("data", {}):
                found.append(out["data"][kind])
    return found


def _check_quickstart(nb):
    text = "\n".join(_outputs(nb, "text"))
    assert "nearest neighbour of each sentence: [1, 0, 3, 2, 5, 4]" in text
    assert "copied 103 leaves" in text and "new 2 (classifier)" in text
    before, after = map(float, re.search(r"test accuracy: ([\d.]+) before .* -> ([\d.]+) after",
                                         text).groups())
    assert after >= 0.7 and after > before + 0.15, (before, after)
    assert len(_outputs(nb, "text/markdown")) == 1        # the cosine-similarity table


def _check_pretrain_t5(nb):
    text = "\n".join(_outputs(nb, "text"))
    first, last = map(float, re.search(r"loss ([\d.]+) at step 1 -> ([\d.]+) at step 40",
                                       text).groups())
    assert last < first - 2.0, (first, last)
    assert re.search(r"prediction: <extra_id_0>", text)
    assert len(_outputs(nb, "image/png")) == 1            # the loss curve


def _check_sharding(nb):
    text = "\n".join(_outputs(nb, "text"))
    assert "8 devices" in text
    assert "P('fsdp', 'tensor')" in text and "P('tensor', 'fsdp')" in text
    shares = re.findall(r"parameters on device 0 \((\d+)%\)", text)
    assert shares == ["100", "13", "25"]
    # visualize_array_sharding: the 2x2 blocks of the data x fsdp x tensor mesh
    assert "CPU 0,4" in text and "CPU 3,7" in text


def _check_ablation_results(nb):
    tiny = sorted((ROOT / "docs" / "ablations").glob("*_tiny.png"))
    micro = sorted((ROOT / "docs" / "ablations").glob("*_micro.png"))
    overview = sorted((ROOT / "docs" / "ablations").glob("*_overview.png"))
    assert len(tiny) >= 8 and micro and overview
    assert len(_outputs(nb, "image/png")) == len(tiny) + len(micro) + len(overview)  # one each
    tables = "\n".join(_outputs(nb, "text/markdown"))
    assert "T5 Table 2" in tables and "BERT Table 6" in tables
    assert "scale `micro`" in tables and "Do the paper's orderings hold here?" in tables


CHECKS = {"quickstart": _check_quickstart, "pretrain_t5": _check_pretrain_t5,
          "sharding": _check_sharding, "ablation_results": _check_ablation_results}


def test_every_notebook_is_listed_and_checked():
    assert sorted(p.stem for p in DIR.glob("*.ipynb")) == sorted(execute.NOTEBOOKS)
    assert sorted(CHECKS) == sorted(execute.NOTEBOOKS)


@pytest.mark.parametrize("name", execute.NOTEBOOKS)
def test_committed_notebook_is_in_sync_with_its_source(name):
    committed = nbformat.read(DIR / f"{name}.ipynb", as_version=4)
    assert execute.cell_sources(committed) == execute.cell_sources(execute.source(name)), (
        f"notebooks/{name}.ipynb differs from {name}.py: run "
        f"`.venv/bin/python notebooks/execute.py {name}`")
    errors = [o for c in committed.cells for o in c.get("outputs", [])
              if o.output_type == "error"]
    assert not errors and all(c.get("outputs") is not None
                              for c in committed.cells if c.cell_type == "code")
    assert all(c.execution_count for c in committed.cells if c.cell_type == "code"), (
        "committed notebook has cells that never ran")


@pytest.mark.parametrize("name", execute.NOTEBOOKS)
def test_committed_outputs_show_what_the_notebook_promises(name):
    """What the docs site renders (the saved outputs, not rerun) passes the same checks."""
    CHECKS[name](nbformat.read(DIR / f"{name}.ipynb", as_version=4))


# ablation_results (2 s) runs in CI; the three that train (quickstart 46 s cold on 2 cores)
# run with -m slow: their parts (MiniLM parity, fine-tuning, pretraining, the mesh) have CI
# tests of their own, and the committed outputs are checked above.
@pytest.mark.parametrize("name", sweep(execute.NOTEBOOKS, ci={"ablation_results"}))
def test_notebook_runs_at_ci_settings(name, tmp_path):
    nb = execute.execute(name, ci=True, cwd=tmp_path, timeout=300)
    assert not [o for c in nb.cells for o in c.get("outputs", []) if o.output_type == "error"]
    CHECKS[name](nb)
