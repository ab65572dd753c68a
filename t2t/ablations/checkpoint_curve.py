"""Held-out loss of every kept checkpoint of pretraining runs, beside the unigram floor.

    python -m t2t.ablations.checkpoint_curve RUN_DIR [RUN_DIR ...] [--batches 100]

RUN_DIR is a pretraining's MODEL_DIR (its ``config.gin``, the operative config the run
wrote, rebuilds the experiment). Every checkpoint under ``RUN_DIR/checkpoints`` is scored on
the first ``--batches`` batches of the task's ``<task>_validation`` twin (held-out
documents), and the same batches by the unigram floor (`t2t.evaluation.unigram`: training
target frequencies alone). Both are given twice: over all targets, and over the content
tokens alone (sentinels and EOS weighted 0), since a denoising model predicts the sentinels'
order from position and beats the floor there without knowing anything of the text. A
content loss near its floor means the model has learned little beyond how often each token
is a target: what the micro scale's learning curves (issue 22) read.
Prints a markdown table; ``--json PATH`` also writes the rows.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
from typing import Any, Dict, List

import numpy as np

from t2t.errors import ConfigError
from t2t.evaluation import unigram

UNIGRAM_TRAIN_BATCHES = 200


def content_only(batch: Dict[str, np.ndarray], vocab) -> Dict[str, np.ndarray]:
    """`batch` with the targets that are sentinels or EOS weighted 0."""
    ids_key, weights_key = next((i, w) for i, w in unigram.TARGET_KEYS if i in batch)
    ids = np.asarray(batch[ids_key])
    content = (ids != vocab.eos_id) & ~((ids >= vocab.vocab_size - vocab.extra_ids)
                                        & (ids < vocab.vocab_size))
    return {**batch, weights_key: np.asarray(batch[weights_key]) * content}


def run_curve(model_dir: str, batches: int) -> List[Dict[str, Any]]:
    """[{run, step, loss, unigram_loss, content_loss, content_unigram_loss}] for each kept
    checkpoint of `model_dir`."""
    import gin

    from t2t.data import tasks as tasks_lib
    from t2t.run import experiment as experiment_lib
    from t2t.run import finetune, gin_utils
    from t2t.train.checkpoints import Checkpointer

    config = os.path.join(model_dir, "config.gin")
    if not os.path.exists(config):
        raise ConfigError(f"{model_dir!r} has no config.gin: name a pretraining's MODEL_DIR")
    gin.clear_config()
    gin_utils.parse([config], [f"MODEL_DIR = {model_dir!r}"])
    try:
        exp = experiment_lib.experiment()
    finally:
        gin.clear_config()
    exp.eval_task = tasks_lib.get_task(f"{exp.task.name}_validation")
    heldout = list(itertools.islice(exp.eval_data(), batches))
    counts = unigram.count_targets(exp.data(), exp.trainer.model.config.vocab_size,
                                   UNIGRAM_TRAIN_BATCHES)
    content = [content_only(b, exp.eval_task.vocabulary) for b in heldout]
    floor = unigram.unigram_loss(counts, heldout)
    content_floor = unigram.unigram_loss(counts, content)
    target = exp.trainer.abstract_init(heldout[0]).params   # also sets the shardings
    rows = []
    with Checkpointer(finetune.checkpoint_dir(model_dir), async_save=False) as ckpt:
        steps = ckpt.all_steps()
    for step in steps:
        params = finetune.restore_params(model_dir, target, step, what="MODEL_DIR")
        loss = exp.trainer.evaluate(params, iter(heldout), steps=None)["loss"]
        content_loss = exp.trainer.evaluate(params, iter(content), steps=None)["loss"]
        rows.append({"run": model_dir, "step": step, "loss": loss, "unigram_loss": floor,
                     "content_loss": content_loss, "content_unigram_loss": content_floor,
                     "heldout_batches": len(heldout)})
        print(f"{model_dir} step {step}: held-out loss {loss:.3f} (unigram {floor:.3f}); "
              f"content tokens {content_loss:.3f} (unigram {content_floor:.3f})", flush=True)
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    """Markdown: a row per checkpoint, losses in nats per target token."""
    lines = ["| run | step | held-out loss | unigram | content-token loss | unigram "
             "| content below unigram |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['step']} | {r['loss']:.3f} | {r['unigram_loss']:.3f} "
                     f"| {r['content_loss']:.3f} | {r['content_unigram_loss']:.3f} "
                     f"| {r['content_unigram_loss'] - r['content_loss']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--batches", type=int, default=100,
                        help="held-out batches scored per checkpoint (default 100)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    rows = [r for d in args.model_dirs for r in run_curve(d, args.batches)]
    print(table(rows), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
