"""ELMo runs (Peters et al. 2018): `t2t train` pretrains the biLM (MODEL_FAMILY 'elmo', the
`bible_web_elmo` task through the `elmo` converter; configs/experiments/elmo_tiny_bible.gin)
and then, when `elmo_downstream.task` is bound, feeds the trained biLM's frozen layers
through the scalar mix into a classifier on a downstream task (Sec. 3.3) and reports the
learned mix weights, writing them to MODEL_DIR/elmo_downstream.json.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Dict, Optional

import gin
import jax
import jax.numpy as jnp
import numpy as np

from t2t import storage
from t2t.data.catalog import elmo as bilm
from t2t.errors import ConfigError
from t2t.models import elmo

_log = logging.getLogger(__name__)

TASKS = {"kjv_or_web": (bilm.kjv_or_web, ("web", "kjv"))}   # name -> (split fn, label names)


def bilm_layers(model: elmo.ElmoModel, params, batch: Dict[str, np.ndarray],
                chunk: int = 64) -> np.ndarray:
    """The frozen biLM's layers [L+1, N, l, 2p] for a whole feature batch, `chunk` rows
    at a time (one compiled shape)."""
    fn = jax.jit(lambda p, b: model.layers(p, b))
    n = len(batch["token_ids"])
    out = []
    for start in range(0, n, chunk):
        rows = {k: v[start:start + chunk] for k, v in batch.items()}
        short = chunk - len(rows["token_ids"])
        if short:      # pad the last chunk to the compiled shape, drop the padding after
            rows = {k: np.concatenate([v, np.zeros((short, *v.shape[1:]), v.dtype)])
                    for k, v in rows.items()}
        out.append(np.asarray(fn(params, {k: jnp.asarray(v) for k, v in rows.items()}))
                   [:, :chunk - short])
    return np.concatenate(out, axis=1)


@gin.configurable
def elmo_downstream(model: elmo.ElmoModel, params, vocabulary, feature_lengths: Dict[str, int],
                    model_dir: str, task: Optional[str] = None, train_examples: int = 2000,
                    eval_split: str = "test", eval_examples: int = 1000, steps: int = 300,
                    batch_size: int = 64, learning_rate: float = 1e-2,
                    dropout_rate: float = 0.0, seed: int = 0) -> Optional[Dict[str, Any]]:
    """Train ELMo_task = gamma * sum_j softmax(s)_j h_j (+ mean pooling and a linear
    classifier) on `train_examples` of `task`'s train split with the biLM frozen, score
    `eval_examples` of `eval_split`; None when no task is bound."""
    if task is None:
        return None
    if task not in TASKS:
        raise ConfigError(f"elmo_downstream.task {task!r} is not one of {sorted(TASKS)}")
    split_fn, label_names = TASKS[task]
    start = time.time()
    length, chars = feature_lengths["tokens"], feature_lengths.get("characters")
    data = {}
    for split, limit in (("train", train_examples), (eval_split, eval_examples)):
        texts, labels = split_fn(split, limit)
        batch = bilm.features(texts, vocabulary, length, chars or model.config.max_chars)
        data[split] = (bilm_layers(model, params, batch), batch["token_ids"], np.asarray(labels))
    layers, tokens, labels = data["train"]
    head, history = elmo.train_mix_classifier(
        layers, tokens, labels, len(label_names), steps=steps, batch_size=batch_size,
        learning_rate=learning_rate, dropout_rate=dropout_rate, seed=seed)
    mix = elmo.mix_weights(head)
    result = {
        "task": task, "train_examples": len(labels), "eval_split": eval_split,
        "eval_examples": len(data[eval_split][2]), "steps": steps,
        "accuracy": elmo.mix_accuracy(head, *data[eval_split], len(label_names)),
        "majority": float(max(np.mean(data[eval_split][2]), 1 - np.mean(data[eval_split][2]))),
        "mix_weights": [round(float(w), 4) for w in mix["weights"]],
        "gamma": round(float(mix["gamma"]), 4),
        "loss_first": history[0], "loss_last": float(np.mean(history[-10:])),
        "seconds": round(time.time() - start, 1)}
    if jax.process_index() == 0:
        storage.write_text(os.path.join(model_dir, "elmo_downstream.json"),
                           json.dumps(result, indent=1) + "\n")
    return result


def summary_lines(result: Dict[str, Any]) -> list:
    """What `t2t train` prints after the downstream fit."""
    w = ", ".join(f"{x:.3f}" for x in result["mix_weights"])
    return [f"downstream {result['task']}: {result['train_examples']} training examples, "
            f"{result['steps']} steps, accuracy {result['accuracy']:.3f} on "
            f"{result['eval_examples']} {result['eval_split']} examples (majority class "
            f"{result['majority']:.3f})",
            f"scalar mix softmax(s) over [tokens, LSTM 1, LSTM 2]: [{w}], gamma "
            f"{result['gamma']:.3f}"]


def after_pretraining(exp, result) -> list:
    """For an ELMo run (`exp` from `experiment.experiment`): `elmo_downstream` on the
    trained biLM and its summary lines; [] for other families or with no task bound."""
    model = exp.trainer.model
    if not isinstance(model, elmo.ElmoModel):
        return []
    out = elmo_downstream(model, result.state.params, exp.task.vocabulary,
                          exp.converter.lengths, exp.trainer.config.model_dir)
    return summary_lines(out) if out else []
