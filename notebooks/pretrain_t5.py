# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (t2t)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Pretrain a tiny T5 on the Bible, plot the loss, denoise a verse
#
# The README's main job (`configs/experiments/t5_tiny_bible.gin`: T5 1.1, span corruption
# with mean span 3 and 15% noise, Adafactor with the inverse-square-root schedule, on the
# bundled World English Bible with a SentencePiece vocabulary trained on it) from Python,
# shrunk with gin bindings. `t2t train --gin_file=experiments/t5_tiny_bible.gin
# --gin.MODEL_DIR=...` runs the same thing from the shell.
#
# Settings: with `T2T_NOTEBOOK_CI=1` (the test, `tests/test_notebooks.py`) the model is
# `models/t5/1_1/test.gin` (2+2 layers, d_model 32) trained 40 steps of batch 8 on 64-token
# inputs; the committed outputs come from the same settings. Unset, it trains the README's
# `tiny` model (4+4 layers, d_model 128) 300 steps of batch 16 on 128-token inputs (a few
# minutes on a laptop CPU). Neither has learned the verses: the CI model's predictions are
# mostly sentinels, the tiny one's sentinels and frequent words; the README's 500-step run
# and `--gin.TRAIN_STEPS=5000` go further.

# %%
import os
import tempfile
import warnings

import matplotlib.pyplot as plt
from tqdm import TqdmWarning

with warnings.catch_warnings():      # tqdm's "IProgress not found": no ipywidgets, plain bars
    warnings.simplefilter("ignore", TqdmWarning)
    from t2t.run import gin_utils
    from t2t.run import experiment
    from t2t.train.trainer import fit

plt.rcParams["figure.dpi"] = 80

CI = os.environ.get("T2T_NOTEBOOK_CI") == "1"
if CI:
    settings = ["models/t5/1_1/test.gin"], 40, 8, "{'inputs': 64, 'targets': 16}"
else:
    settings = [], 300, 16, "{'inputs': 128, 'targets': 32}"
extra_files, steps, batch_size, lengths = settings
model_dir = tempfile.mkdtemp(prefix="t5_tiny_")

# %% [markdown]
# ## The config: the README's experiment plus a few bindings
#
# Any `--gin.NAME=value` of the command line is a binding here. A misspelt name, or a macro
# the config never uses, fails at this cell (as on the command line), naming the nearest
# valid ones.

# %%
bindings = [
    f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {steps}", f"BATCH_SIZE = {batch_size}",
    f"TASK_FEATURE_LENGTHS = {lengths}", "TrainConfig.log_every = 2",
    "TrainConfig.checkpoint_every = 1000", "TrainConfig.progress_bar = False",
    "TrainConfig.measure_peak = False", "TrainConfig.async_checkpoint = False"]
gin_utils.parse(["experiments/t5_tiny_bible.gin", *extra_files], bindings)
gin_utils.check_bindings(bindings)
exp = experiment.experiment()          # model, task, vocabulary, feature converter, trainer
cfg = exp.trainer.model.config
print(f"task {exp.task.name}: vocabulary of {exp.task.vocabulary.vocab_size} pieces")
print(f"T5 1.1: {cfg.num_encoder_layers}+{cfg.num_decoder_layers} layers, d_model "
      f"{cfg.d_model}, d_ff {cfg.d_ff}, {cfg.num_heads} heads, vocab {cfg.vocab_size}; "
      f"mesh {dict(exp.trainer.mesh.shape)}")

# %% [markdown]
# ## One span-corrupted example
#
# Spans of the verse are replaced by sentinels in the inputs; the targets are the dropped
# spans, each after its sentinel.

# %%
example = exp.task.preprocess(exp.task.source[0], (0, 0, 0), exp.converter.lengths)[0]
decode = exp.task.vocabulary.decode
print("inputs: ", decode(example["inputs"].tolist())[:300])
print("targets:", decode(example["targets"].tolist()))

# %% [markdown]
# ## Train
#
# `fit` is the loop `t2t train` runs: sharded, jitted steps; metrics; a checkpoint at the end
# (run the cell again and it resumes, here already done).

# %%
result = fit(exp.trainer, exp.data())
rows = [r for r in result.history if "loss" in r]
print(f"loss {rows[0]['loss']:.3f} at step {rows[0]['step']} -> {rows[-1]['loss']:.3f} at "
      f"step {rows[-1]['step']}; accuracy {rows[0]['accuracy']:.3f} -> "
      f"{rows[-1]['accuracy']:.3f}")

# %%
fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2))
steps_logged = [r["step"] for r in rows]
left.plot(steps_logged, [r["loss"] for r in rows])
left.set(xlabel="step", ylabel="loss", title="span-corruption loss")
right.plot(steps_logged, [r["accuracy"] for r in rows])
right.set(xlabel="step", ylabel="token accuracy", title="target-token accuracy")
for ax in (left, right):
    ax.grid(alpha=0.3)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Denoise a corrupted verse
#
# Greedy decoding on the KV cache: the model fills in the sentinels of Genesis 1:1's
# corrupted inputs.

# %%
denoised = experiment.example_prediction(exp, result.state.params)
for key in ("inputs", "targets", "prediction"):
    print(f"{key:>10}: {denoised[key][:200]}")
