"""The docs site (docs/, Sphinx + MyST) builds without a warning, and every shell command its
pages and the README's tour show is either run here or marked as not run, with why.

The convention, for a ```bash block: a command the tests do not run has a comment line
`# not run by the tests: <why>` above it, in the same group of lines (no blank line
between: a marker covers the commands below it up to the next blank line). A command block
must be tagged `bash`, so that this test sees it."""
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MARK = "# not run by the tests:"
T2T = pathlib.Path(sys.executable).with_name("t2t")

# The cheap commands the pages show that this test runs for real (a few seconds each), and
# what each one's output must contain.
RUN_HERE = {
    "t2t --help": "usage: t2t",
    "t2t launch --help": "usage: t2t launch",
    "t2t data build --help": "usage:",
    "t2t data list": "State of the Union",
    "t2t params --gin_file=models/bert/base.gin --gin_file=models/t5/1_1/base.gin":
        "110,106,428",
}

# The README's first two blocks stay byte-identical to what CI and the main job run, so they
# carry no marker: the second is .ci/run's command (tests/test_readme.py), the first the main
# job (tests/train/test_resume.py runs its config at test size from the command line).
README_UNMARKED_BLOCKS = 2

# A line that starts a shell command, to find command blocks that are not tagged bash.
COMMAND = re.compile(r"^(t2t|python3?|\.venv/|pip|bash|sbatch|echo|export|cd|git|/usr/bin/time|"
                     r"[A-Z][A-Z0-9_]*=\S)")


def _pages():
    """(name, text) of every page of the site and of the README, the README's tour only."""
    pages = [(str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
             for p in sorted(DOCS.rglob("*.md"))]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    return pages + [("README.md", readme)]


def _blocks(text):
    """(info string, body) of each fenced block."""
    return re.findall(r"^```([^\n`]*)\n(.*?)^```", text, flags=re.S | re.M)


def _commands(body):
    """(command, marked) for each command of a bash block: continuation lines joined."""
    found = []
    for group in re.split(r"\n[ \t]*\n", body):
        marked, pending = False, ""
        for line in group.splitlines():
            stripped = line.strip()
            if pending:
                pending += " " + stripped.rstrip("\\").strip()
                if not stripped.endswith("\\"):
                    found.append((pending, marked))
                    pending = ""
                continue
            if not stripped:
                continue
            if stripped.startswith("#"):
                marked = marked or stripped.startswith(MARK)
                continue
            if stripped.endswith("\\"):
                pending = stripped.rstrip("\\").strip()
            else:
                found.append((re.sub(r"\s+#.*$", "", stripped), marked))
        if pending:
            found.append((pending, marked))
    return found


def _shown_commands():
    """Every (page, command, marked) of a bash block, the README's first blocks left out."""
    shown = []
    for name, text in _pages():
        blocks = [(info, body) for info, body in _blocks(text) if info.strip() == "bash"]
        if name == "README.md":
            blocks = blocks[README_UNMARKED_BLOCKS:]
        for _, body in blocks:
            shown += [(name, command, marked) for command, marked in _commands(body)]
    return shown


def test_the_site_builds_without_a_warning(tmp_path):
    build = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
    assert "WARNING" not in build.stderr, build.stderr[-5000:]
    for page in ["index", "getting_started", "api", "ablations/README", "ablations/t5_table2_micro",
                 "notebooks/quickstart", "notebooks/ablation_results", "notes/index"]:
        assert (tmp_path / "html" / f"{page}.html").is_file(), page
    api = (tmp_path / "html" / "api.html").read_text(encoding="utf-8")
    for name in ["t2t.nn.TransformerConfig", "t2t.nn.EncoderDecoder", "t2t.models.bert.hidden_states",
                 "t2t.convert.hf.load_pretrained", "t2t.data.vocab.WordPieceVocabulary",
                 "t2t.data.tasks.get_task", "t2t.data.tasks.register_task",
                 "t2t.train.trainer.Trainer", "t2t.train.trainer.fit"]:
        assert f'id="{name}"' in api, f"{name} is not in the API reference"


def test_every_shown_command_is_run_here_or_marked():
    shown = _shown_commands()
    assert len(shown) > 20                       # the parser sees the pages' commands
    unmarked = [f"{page}: {command}" for page, command, marked in shown
                if not marked and command not in RUN_HERE]
    assert not unmarked, ("commands neither run by tests/test_docs.py nor marked "
                          f"'{MARK} <why>':\n" + "\n".join(unmarked))
    stale = set(RUN_HERE) - {command for _, command, _ in shown}
    assert not stale, f"RUN_HERE lists commands no page shows: {sorted(stale)}"


def test_command_blocks_are_tagged_bash():
    untagged = []
    for name, text in _pages():
        for info, body in _blocks(text):
            lines = [line for line in body.splitlines()
                     if line.strip() and not line.lstrip().startswith("#")]
            if not info.strip() and lines and COMMAND.match(lines[0]):
                untagged.append(f"{name}: {lines[0][:80]}")
    assert not untagged, "command blocks without the bash tag:\n" + "\n".join(untagged)


def test_the_marker_parser():
    body = ("# not run by the tests: slow\nt2t train --a \\\n    --b\nt2t eval\n\n"
            "t2t --help\n# a note\nt2t data list   # datasets\n")
    assert _commands(body) == [("t2t train --a --b", True), ("t2t eval", True),
                               ("t2t --help", False), ("t2t data list", False)]


@pytest.mark.parametrize("command", sorted(RUN_HERE))
def test_the_commands_run_here(command):
    argv = shlex.split(command)
    assert argv[0] == "t2t"
    run = subprocess.run([str(T2T)] + argv[1:], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert RUN_HERE[command] in run.stdout, run.stdout[-2000:]
