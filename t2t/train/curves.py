"""What a finished run shows a person: a loss-curve PNG beside metrics.jsonl, and one line
comparing the first logged step with the last (whatever accuracies the family logs)."""
from __future__ import annotations

import io
import math
from typing import Dict, List, Optional, Sequence

from t2t import storage


def _accuracy_keys(rows: Sequence[Dict]) -> List[str]:
    """The training accuracies a family logs: `accuracy` (T5, GPT), `mlm_accuracy` and
    `nsp_accuracy` (BERT), ... — never eval/ ones."""
    keys = {k for r in rows for k in r if k.endswith("accuracy") and "/" not in k}
    return sorted(keys, key=lambda k: (k != "accuracy", k))


def train_rows(rows: Sequence[Dict]) -> List[Dict]:
    """Rows with a training loss, ordered by step."""
    return sorted((r for r in rows if "loss" in r), key=lambda r: r["step"])


def summary_line(rows: Sequence[Dict]) -> Optional[str]:
    """`loss A at step 1 -> B at step N (accuracy a -> b)`, over the whole run (a resumed run's
    earlier steps included); None when nothing was logged."""
    logged = train_rows(rows)
    if not logged:
        return None
    first, last = logged[0], logged[-1]
    line = (f"loss {first['loss']:.3f} at step {first['step']} -> {last['loss']:.3f} at step "
            f"{last['step']}")
    accuracies = [f"{k} {first.get(k, math.nan):.3f} -> {last.get(k, math.nan):.3f}"
                  for k in _accuracy_keys(logged)]
    return line + (f" ({', '.join(accuracies)})" if accuracies else "")


def plot_metrics(rows: Sequence[Dict], png_path: str, title: str = "") -> Optional[str]:
    """Training (and eval, if logged) loss against step, with the accuracies on a second
    panel; written to `png_path`. None when there is nothing to plot, or no matplotlib
    (the `plots` extra)."""
    logged = train_rows(rows)
    if not logged:
        return None
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    accuracies = _accuracy_keys(logged)
    fig, axes = plt.subplots(1, 2 if accuracies else 1, figsize=(10 if accuracies else 6, 4),
                             squeeze=False)
    ax = axes[0][0]
    ax.plot([r["step"] for r in logged], [r["loss"] for r in logged], label="train")
    evals = sorted((r for r in rows if "eval/loss" in r), key=lambda r: r["step"])
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval/loss"] for r in evals], "o-", label="eval")
    ax.set(xlabel="step", ylabel="loss", title=f"loss: {title}" if title else "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    if accuracies:
        ax = axes[0][1]
        for key in accuracies:
            points = [(r["step"], r[key]) for r in logged if key in r]
            ax.plot(*zip(*points), label=key)
        ax.set(xlabel="step", ylabel="accuracy", title="accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    storage.path(png_path).write_bytes(buffer.getvalue())   # local, or gs:// MODEL_DIR
    return png_path
