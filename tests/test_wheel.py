"""The built wheel works outside the checkout: its gin configs ship inside the package, so an
installed (not editable) t2t counts parameters and trains 3 steps from another directory,
with only the core dependencies (the extras' packages cannot be imported there)."""
import pathlib
import subprocess
import sys
import zipfile

from tests.jax_setup import cpu_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The extras' packages (eval, tfds, plots, corpora, peers): a core-only install has none.
EXTRAS = ("sklearn", "sacrebleu", "rouge_score", "matplotlib", "tensorflow_datasets", "pyarrow",
          "zstandard", "torch", "transformers")
CORE_ONLY = f"""
import importlib.abc, sys
class _CoreOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (core-only install)", name=name)
sys.meta_path.insert(0, _CoreOnly())
"""


def test_wheel_installs_and_runs_from_another_directory(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    wheel, = (tmp_path / "dist").glob("t2t-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "t2t/configs/experiments/t5_tiny_bible.gin" in names
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:        # what `pip install --no-deps` puts on the path
        z.extractall(site)
    (site / "sitecustomize.py").write_text(CORE_ONLY)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = cpu_env(PYTHONPATH=str(site))

    def t2t(*args):
        return subprocess.run([sys.executable, "-m", "t2t.cli", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)

    where = subprocess.run([sys.executable, "-c", "import t2t; print(t2t.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr   # not the checkout
    params = t2t("params", "--gin_file=models/bert/base.gin")
    assert params.returncode == 0 and "110,106,428" in params.stdout, params.stderr[-2000:]
    train = t2t("train", "--gin_file=experiments/gpt_tiny_bible.gin",
                "--gin_file=models/gpt2/test.gin", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=2",
                "--gin.TASK_FEATURE_LENGTHS={'targets': 16}", "--gin.WARMUP_STEPS=1",
                "--gin.TrainConfig.progress_bar=False", "--gin.MODEL_DIR=run")
    assert train.returncode == 0, train.stderr[-3000:]
    assert "stopped at step 3 (done)" in train.stdout
    assert "loss curve: not plotted (pip install 't2t[plots]'" in train.stdout   # core only
    assert (work / "run" / "checkpoints" / "3").is_dir()
