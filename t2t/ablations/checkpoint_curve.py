"""What a pretraining has learned at each kept checkpoint: held-out loss beside the unigram
floor and, optionally, how well its frozen encoder separates a downstream task's classes.

    python -m t2t.ablations.checkpoint_curve RUN_DIR [RUN_DIR ...] [--batches 100]
        [--probe_task micro_bbc_topic_200]

RUN_DIR is a pretraining's MODEL_DIR (its ``config.gin``, the operative config the run
wrote, rebuilds the experiment). Step 0 is the run's initialisation (its seed), then every
checkpoint under ``RUN_DIR/checkpoints``:

* **held-out loss** (BERT: masked-LM loss) on the first ``--batches`` batches of the task's
  ``<task>_validation`` twin (held-out documents), and the same batches scored by the unigram floor
  (`t2t.evaluation.unigram`: training target frequencies alone). Both are given twice: over
  all targets, and over the content tokens alone (sentinels and EOS weighted 0), since a
  denoising model predicts the sentinels' order from position and beats the floor there
  without knowing anything of the text. A content loss near its floor means the model has
  learned little beyond how often each token is a target.
* **frozen features** (``--probe_task``, encoder-decoder runs): each example's encoder
  outputs, mean-pooled over its tokens, classify the task's validation split by the nearest
  class centroid of its training split (cosine), and the mean pairwise cosine of 300
  validation examples says how alike the encoder makes all inputs (1.0: collapsed).

This is what the micro scale's learning curves read (issue 22, docs/ablations). Prints a
markdown table; ``--json PATH`` also writes the rows.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

from t2t import platforms
from t2t.errors import ConfigError
from t2t.evaluation import unigram

SIMILARITY_EXAMPLES = 300


def content_only(batch: Dict[str, np.ndarray], vocab) -> Dict[str, np.ndarray]:
    """`batch` with the targets that are sentinels or EOS weighted 0 (a vocabulary without
    sentinels, BERT's WordPiece, masks only content tokens: `batch` itself)."""
    if not hasattr(vocab, "extra_ids"):
        return batch
    ids_key, weights_key = next((i, w) for i, w in unigram.TARGET_KEYS if i in batch)
    ids = np.asarray(batch[ids_key])
    content = (ids != vocab.eos_id) & ~((ids >= vocab.vocab_size - vocab.extra_ids)
                                        & (ids < vocab.vocab_size))
    return {**batch, weights_key: np.asarray(batch[weights_key]) * content}


class HeldoutScorer:
    """`score(params)` -> (loss over all targets, loss over content targets) on `batches`
    and their `content_only` twins, each the mean over batches of the run's own eval loss
    (as `Trainer.evaluate` gives it; BERT's masked-LM loss alone, without NSP's), in one
    forward pass a batch: the two losses differ only in their target weights, and XLA
    merges the two identical forward passes of the jitted function into one."""

    def __init__(self, trainer, batches: List[Dict[str, np.ndarray]],
                 content: List[Dict[str, np.ndarray]]):
        import jax
        import jax.numpy as jnp

        weights_key = next(w for i, w in unigram.TARGET_KEYS if i in batches[0])
        model = trainer.model
        self.trainer, self.weights_key = trainer, weights_key
        self.batches = batches
        self.content = [b[weights_key] for b in content]

        def target_loss(params, batch):
            metrics = model.loss_fn(params, batch, None)[1]
            return metrics.get("mlm_loss", metrics["loss"])

        def both(params, batch, content_weights):            # -> [2]
            reweighted = {**batch, weights_key: content_weights}
            return jnp.stack([target_loss(params, b) for b in (batch, reweighted)])

        self.jitted = jax.jit(both)

    def lowered(self, params):
        """The jitted scorer lowered for the first batch (for inspecting its HLO)."""
        from t2t.train import partitioning
        with partitioning.sharding_context(self.trainer.mesh, self.trainer.rules):
            return self.jitted.lower(params, *self._inputs(0))

    def _inputs(self, i: int):
        batch = self.trainer.global_batch(self.batches[i])
        content = self.trainer.global_batch({self.weights_key: self.content[i]})
        return batch, content[self.weights_key]

    def score(self, params) -> tuple[float, float]:
        import jax

        from t2t.train import partitioning
        with partitioning.sharding_context(self.trainer.mesh, self.trainer.rules):
            losses = [jax.device_get(self.jitted(params, *self._inputs(i)))
                      for i in range(len(self.batches))]
        loss, content = np.mean(losses, axis=0)
        return float(loss), float(content)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def nearest_centroid_accuracy(train_x: np.ndarray, train_y: np.ndarray, val_x: np.ndarray,
                              val_y: np.ndarray) -> float:
    """Percent of `val_x` [n, d] whose most cosine-similar training class centroid is
    their label."""
    classes = np.unique(train_y)
    unit_train = _unit(train_x)
    centroids = _unit(np.stack([unit_train[train_y == c].mean(0) for c in classes]))
    predicted = classes[(_unit(val_x) @ centroids.T).argmax(1)]
    return float((predicted == val_y).mean() * 100)


def mean_pairwise_cosine(x: np.ndarray) -> float:
    """Mean cosine similarity over the distinct pairs of rows of `x` [n, d]."""
    unit = _unit(x)
    n = len(unit)
    return float(((unit @ unit.T).sum() - n) / (n * (n - 1)))


class FeatureProbe:
    """A classification task's train and validation examples (the first `max_examples` of
    each split; None: all), one per row (unpacked), with labels = their target sequences;
    `score(params)` -> {probe_accuracy, mean_cosine}."""

    def __init__(self, exp, task_name: str, max_examples: Optional[int] = None):
        import jax
        import jax.numpy as jnp

        from t2t.data import tasks as tasks_lib
        from t2t.nn.stacks import EncoderDecoder
        if not isinstance(exp.trainer.model.module, EncoderDecoder):
            raise ConfigError(f"--probe_task reads an encoder: the run is "
                              f"{exp.trainer.model.family!r}, not an encoder-decoder (t5)")
        task = tasks_lib.get_task(task_name)
        converter = type(exp.converter)(exp.converter.lengths, pack=False)
        self.splits = {}
        for split in ("train", "validation"):
            batches = task.get_pipeline(converter, 50, 0, split=split, shuffle=False,
                                        num_epochs=1)
            if max_examples is not None:
                batches = itertools.islice(batches, -(-max_examples // 50))
            batches = list(batches)
            tokens = np.concatenate([b["encoder_input_tokens"] for b in batches])
            targets = np.concatenate([b["decoder_target_tokens"] for b in batches])
            self.splits[split] = (tokens[:max_examples], targets[:max_examples])
        known = np.concatenate([t for _, t in self.splits.values()])
        _, labels = np.unique(known, axis=0, return_inverse=True)   # a label per target
        n_train = len(self.splits["train"][1])
        self.labels = {"train": labels[:n_train], "validation": labels[n_train:]}
        module = exp.trainer.model.module

        @jax.jit
        def pooled(params, tokens):                      # [b, len] -> [b, d_model]
            encoded = module.apply({"params": params}, tokens, method="encode")
            mask = (tokens != 0)[..., None].astype(jnp.float32)
            return (encoded.astype(jnp.float32) * mask).sum(1) / mask.sum(1)

        self._pooled = pooled

    def features(self, params, split: str) -> np.ndarray:
        tokens = self.splits[split][0]
        return np.concatenate([np.asarray(self._pooled(params, tokens[i:i + 50]))
                               for i in range(0, len(tokens), 50)])

    def score(self, params) -> Dict[str, float]:
        train, val = self.features(params, "train"), self.features(params, "validation")
        return {"probe_accuracy": nearest_centroid_accuracy(
                    train, self.labels["train"], val, self.labels["validation"]),
                "mean_cosine": mean_pairwise_cosine(val[:SIMILARITY_EXAMPLES])}


def load_experiment(model_dir: str):
    """The pretraining's experiment, rebuilt from `model_dir/config.gin`, evaluating on its
    task's `<task>_validation` twin (held-out documents)."""
    import gin

    from t2t.data import tasks as tasks_lib
    from t2t.run import experiment as experiment_lib
    from t2t.run import gin_utils

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
    return exp


def run_curve(model_dir: str, batches: int, probe_task: Optional[str] = None,
              probe_examples: Optional[int] = None) -> List[Dict[str, Any]]:
    """A row per step (0 = initialisation, then each kept checkpoint of `model_dir`): loss,
    unigram_loss, content_loss, content_unigram_loss (nats per target) and, with
    `probe_task`, probe_accuracy and mean_cosine (on `probe_examples` of each split)."""
    from t2t.train.checkpoints import Checkpointer, checkpoint_dir, restore_params

    exp = load_experiment(model_dir)
    heldout = list(itertools.islice(exp.eval_data(), batches))
    counts = unigram.training_counts(exp)
    content = [content_only(b, exp.eval_task.vocabulary) for b in heldout]
    floor = unigram.unigram_loss(counts, heldout)
    content_floor = unigram.unigram_loss(counts, content)
    probe = FeatureProbe(exp, probe_task, probe_examples) if probe_task else None
    target = exp.trainer.abstract_init(heldout[0]).params   # also sets the shardings
    scorer = HeldoutScorer(exp.trainer, heldout, content)
    with Checkpointer(checkpoint_dir(model_dir), async_save=False) as ckpt:
        steps = ckpt.all_steps()
    rows = []
    for step in [0] + steps:
        params = (exp.trainer.init_state(heldout[0]).params if step == 0 else
                  restore_params(model_dir, target, step, what="MODEL_DIR"))
        loss, content_loss = scorer.score(params)
        row = {"run": model_dir, "step": step, "loss": loss, "unigram_loss": floor,
               "content_loss": content_loss, "content_unigram_loss": content_floor,
               "heldout_batches": len(heldout)}
        if probe is not None:
            row.update(probe.score(params), probe_task=probe_task)
        rows.append(row)
        print(f"{model_dir} step {step}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in row.items() if isinstance(v, float)), flush=True)
    return rows


def table(rows: List[Dict[str, Any]]) -> str:
    """Markdown: a row per checkpoint, losses in nats per target token."""
    probe = any("probe_accuracy" in r for r in rows)
    head = ("| run | step | held-out loss | unigram | content-token loss | unigram "
            "| content below unigram |")
    lines = [head + (" frozen-feature accuracy | mean cosine |" if probe else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if probe else "")]
    for r in rows:
        line = (f"| {r['run']} | {r['step']} | {r['loss']:.3f} | {r['unigram_loss']:.3f} "
                f"| {r['content_loss']:.3f} | {r['content_unigram_loss']:.3f} "
                f"| {r['content_unigram_loss'] - r['content_loss']:.3f} |")
        if probe:
            line += (f" {r['probe_accuracy']:.1f} | {r['mean_cosine']:.3f} |"
                     if "probe_accuracy" in r else " | |")
        lines.append(line)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--batches", type=int, default=100,
                        help="held-out batches scored per checkpoint (default 100)")
    parser.add_argument("--probe_task", help="a classification task whose classes the frozen "
                        "encoder features should separate, e.g. micro_bbc_topic_200")
    parser.add_argument("--probe_examples", type=int,
                        help="probe on the first N examples of each split (default: all)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    platforms.set_default_platforms()        # as the `t2t` command line does
    try:
        rows = [r for d in args.model_dirs
                for r in run_curve(d, args.batches, args.probe_task, args.probe_examples)]
    except ConfigError as e:
        parser.exit(2, f"error: {e}\n")
    print(table(rows), end="")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
