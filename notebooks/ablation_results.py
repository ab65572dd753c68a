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
# # Ablation results: the papers' tables at the tiny and micro scales
#
# The tables and plots `t2t ablate … --scale=tiny` and `--scale=micro` rendered into
# `docs/ablations/` (our numbers beside the papers' published ones, each cell's compute),
# read from there; nothing is trained here. `docs/ablations/README.md` says what the numbers
# mean: at the tiny budget a control fine-tuned from random initialisation beats all
# pretrained cells but one, so the tiny tables show the machinery, not the papers' findings;
# the micro scale (below) is the attempt at orderings that mean something.
#
# Settings: nothing to train, so the test (`T2T_NOTEBOOK_CI=1`) and the committed outputs
# run the same cells. Plots are shown scaled down to 640 pixels wide, in 256 colours.

# %%
import io
import re
from pathlib import Path

from IPython.display import Image, Markdown, display
from PIL import Image as PILImage

import t2t


def find_ablations() -> Path:
    """docs/ablations of this checkout: above the working directory, or beside the package."""
    for root in (Path.cwd(), *Path.cwd().parents, Path(t2t.__file__).resolve().parents[1]):
        if (root / "docs" / "ablations" / "README.md").is_file():
            return root / "docs" / "ablations"
    raise FileNotFoundError("docs/ablations not found: run this notebook inside a t2t checkout")


ABLATIONS = find_ablations()


def show_png(path: Path, width: int = 640) -> None:
    """A PNG scaled to `width` pixels, 256 colours (keeps the notebook small)."""
    image = PILImage.open(path).convert("RGB")
    image = image.resize((width, round(image.height * width / image.width)),
                         PILImage.Resampling.LANCZOS)
    buffer = io.BytesIO()
    image.quantize(256).save(buffer, format="PNG", optimize=True)
    display(Image(data=buffer.getvalue()))


# %% [markdown]
# ## The grids and how far each ran

# %%
readme = (ABLATIONS / "README.md").read_text(encoding="utf-8")
index = re.search(r"^\| table \|.*?(?=\n\n)", readme, re.S | re.M).group(0)
display(Markdown(index))
tables = re.findall(r"\[([a-z0-9_]+_tiny)\.md\]", index)
print(len(tables), "rendered tables:", ", ".join(tables))


# %% [markdown]
# ## Each table and its plot
#
# Our numbers beside the paper's published ones, then each cell's steps, tokens, FLOPs and
# wall time; below each table its plot.

# %%
for name in tables:
    display(Markdown((ABLATIONS / f"{name}.md").read_text(encoding="utf-8")))
    show_png(ABLATIONS / f"{name}.png")


# %% [markdown]
# ## The micro scale
#
# `--scale=micro`: 44.5M tokens of public text, BBC topic from 200 articles and spam from 100
# e-mails, three seeds a row and a "Random init (control)" row in every table. First the
# learning-curve check (does pretraining beat random initialisation at this compute?), then
# each table rendered so far; under each table, "Do the paper's orderings hold here?" sets
# every two rows the paper ranks against ours (the plot's last panel: ours against the
# paper's, a point per row).

# %%
micro = list(dict.fromkeys(re.findall(r"\(([a-z0-9_]+_micro)\.md\)", readme)))
print(len(micro), "rendered at micro:", ", ".join(micro))
for name in micro:
    display(Markdown((ABLATIONS / f"{name}.md").read_text(encoding="utf-8")))
    show_png(ABLATIONS / f"{name}.png")


# %% [markdown]
# ## Every micro table against its control
#
# Each pretrained row's Average minus its table's control, against twice that table's pooled
# seed sd (grey band): the margin issue 22 asked pretraining to clear at this scale. Rendered
# by `python -m t2t.ablations.overview` from the same cells.

# %%
display(Markdown((ABLATIONS / "micro_overview.md").read_text(encoding="utf-8")
                 .split("\n![")[0]))
show_png(ABLATIONS / "micro_overview.png")
