"""The papers' ablation tables as runnable grids: `t2t ablate configs/ablations/<table>.gin`.

`grid` reads a grid's gin file, `runner` runs its cells (resumable, sliceable) and `report`
renders the markdown table and plot. See configs/ablations/README.md.
"""
