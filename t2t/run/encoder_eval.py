"""Compare encoder pretraining runs (BERT and its successors) on equal terms.

* `heldout_mlm`: the masked-LM cross-entropy of a run's MLM head on a held-out task whose
  masking is fixed by its seed, so every system is scored on the same masked tokens.
  BERT, RoBERTa, ALBERT, SpanBERT and DistilBERT use their own MLM head; ELECTRA has none
  on the discriminator, so its generator (the small MLM it trains) is scored.
* `finetune_accuracy`: a brief fine-tuning of the run's encoder (ELECTRA: the
  discriminator) with a fresh pooled-[CLS] `SequenceClassifier` on a sentence(-pair)
  classification task, then the accuracy on its held-out splits.

`t2t mlm_eval MODEL_DIR... [--finetune] [--json FILE]` prints and writes both
(`evaluate_runs`).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.errors import UserError
from t2t.models import families
from t2t.nn.config import TransformerConfig

HELDOUT_TASK = "bible_web_roberta_validation"   # token-level 15% MLM, 80/10/10, single rows
DOWNSTREAM_TASK = "bbc_topic"   # BBC News topic, 5 classes (`t2t data build bbc`)


@dataclasses.dataclass
class EncoderRun:
    """A pretraining MODEL_DIR: its model family, float32 config and latest parameters."""

    model_dir: str
    family: str
    config: TransformerConfig
    params: Any
    generator: Optional[TransformerConfig] = None     # ELECTRA's generator config


def load_run(model_dir: str, step: Optional[int] = None) -> EncoderRun:
    """Reads MODEL_DIR/config.gin (the operative config) and the checkpoint's parameters
    (`t2t.run.model_dir.load_model_dir`)."""
    from t2t.run import configurables as configured
    from t2t.run.model_dir import is_t2t_model_dir, load_model_dir
    if not is_t2t_model_dir(model_dir):
        raise UserError(f"{model_dir!r} has no config.gin: not a t2t MODEL_DIR")
    loaded = load_model_dir(model_dir, step)
    family = loaded.family or "bert"
    if not families.get(family).masked_lm:
        encoders = families.names(lambda f: f.masked_lm, variants=False)
        raise UserError(f"{model_dir!r} is a {family!r} run; mlm_eval compares encoders "
                        f"({', '.join(encoders)})")
    config = loaded.config.replace(dtype="float32", dropout_rate=0.0)
    generator = configured.generator_config(family, config)     # ELECTRA's
    return EncoderRun(model_dir, family, config, loaded.params, generator)


def mlm_logits_fn(run: EncoderRun):
    """jitted (params, batch) -> MLM logits at `masked_positions` [batch, p, vocab]."""
    from t2t.models.bert import BertModel
    from t2t.models.electra import ElectraPretraining
    from t2t.nn.gather import gather_positions

    def args(batch):
        return (batch["encoder_input_tokens"], batch.get("encoder_segment_ids"),
                batch.get("token_type_ids"), batch.get("encoder_positions"))

    if run.generator is not None:      # ELECTRA: the generator predicts the masked tokens
        module = ElectraPretraining(run.config, run.generator)

        def fn(params, batch):
            tokens, segments, types, positions = args(batch)
            return module.apply({"params": params}, tokens, batch["masked_positions"],
                                segments, types, positions, method=ElectraPretraining.generate)
        return jax.jit(fn)

    def head(module, tokens, segments, types, positions, masked_positions):
        hidden = module.encode(tokens, segments, types, positions)
        return module.mlm_head(gather_positions(hidden, masked_positions),
                               module.token_embedder)

    def fn(params, batch):    # BertModel, and SpanBERT/DistilBERT trees (same names)
        return BertModel(run.config).apply({"params": params}, *args(batch),
                                           batch["masked_positions"], method=head)
    return jax.jit(fn)


def heldout_mlm(run: EncoderRun, task: str = HELDOUT_TASK, batch_size: int = 32,
                max_batches: Optional[int] = 20, seed: int = 0, length: int = 128,
                max_predictions: int = 20) -> Dict[str, float]:
    """{"mlm_loss", "mlm_accuracy", "tokens"}: mean over every masked token of the first
    `max_batches` batches of `task` (unshuffled; masking fixed by `seed`)."""
    import t2t.data.catalog.bible_successors  # noqa: F401  registers HELDOUT_TASK
    from t2t.data import converters as conv
    from t2t.data import tasks as tasks_lib
    lengths = {"inputs": length, "max_predictions": max_predictions}
    converter = conv.EncoderConverter(lengths, pack=True, nsp=False)
    data = tasks_lib.get_task(task).get_pipeline(converter, batch_size, seed, shuffle=False,
                                                 num_epochs=1)
    logits_fn = mlm_logits_fn(run)
    total = correct = count = 0.0
    for i, batch in enumerate(data):
        if max_batches is not None and i >= max_batches:
            break
        batch = {k: jnp.asarray(v) for k, v in batch.items()}
        logits = logits_fn(run.params, batch).astype(jnp.float32)          # [b, p, V]
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        target = batch["masked_ids"]
        weights = batch["masked_weights"].astype(jnp.float32)
        nll = -jnp.take_along_axis(log_probs, target[..., None], axis=-1)[..., 0]
        total += float(jnp.sum(nll * weights))
        correct += float(jnp.sum((jnp.argmax(logits, -1) == target) * weights))
        count += float(jnp.sum(weights))
    if count == 0:
        raise UserError(f"task {task!r} gave no masked tokens")
    return {"mlm_loss": total / count, "mlm_accuracy": correct / count, "tokens": int(count)}


def encoder_trunk(run: EncoderRun) -> tuple[TransformerConfig, Any]:
    """(config, {"token_embedder", "encoder", ...}) of the encoder a downstream task
    fine-tunes: the run's own tree, or for ELECTRA the discriminator's."""
    if run.generator is None:
        return run.config, run.params
    from t2t.convert.pretrained import from_t2t
    model_type = families.get(run.family).hf_model_types[0]
    disc = from_t2t(model_type, run.config, run.params, run.generator)["discriminator"]
    return disc.config, disc.params


def finetune_accuracy(run: EncoderRun, vocabulary: Any, task: str = DOWNSTREAM_TASK,
                      steps: int = 100, batch_size: int = 32, learning_rate: float = 1e-3,
                      max_length: int = 64, max_train: Optional[int] = 3200,
                      max_eval: Optional[int] = 1000, seed: int = 0,
                      splits: Sequence[str] = ("validation", "test")) -> Dict[str, float]:
    """AdamW (BERT's recipe: warm-up 10%, linear decay, weight decay 0.01, clip 1) for
    `steps` on the first split of `task`, then accuracy on `splits` ("<split>_accuracy")
    and the training loss of the last 10 steps ("train_loss")."""
    import t2t.data.catalog.offline  # noqa: F401  registers DOWNSTREAM_TASK
    from t2t.data import tasks as tasks_lib
    from t2t.data.finetune_tasks import classification_examples
    from t2t.models.classifiers import SequenceClassifier
    import flax.linen as nn
    task_obj = tasks_lib.get_task(task)
    config, trunk = encoder_trunk(run)
    model = SequenceClassifier(config, len(task_obj.label_names))
    def features(split, limit):
        out = classification_examples(task_obj, split, vocabulary, max_length, limit)
        if config.type_vocab_size == 1:         # RoBERTa: one token type, B segments too
            out["token_type_ids"] = np.zeros_like(out["token_type_ids"])
        return out

    train = features(task_obj.splits[0], max_train)
    rng = np.random.default_rng(seed)
    first = {k: v[:batch_size] for k, v in train.items()}
    params = nn.unbox(model.init_from_pretrained(jax.random.PRNGKey(seed), first, trunk))
    schedule = optax.join_schedules([
        optax.linear_schedule(0.0, learning_rate, max(1, steps // 10)),
        optax.linear_schedule(learning_rate, 0.0, steps - max(1, steps // 10))],
        [max(1, steps // 10)])
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01))
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch, key):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    size = len(train["label"])
    order, losses = rng.permutation(size), []
    key = jax.random.PRNGKey(seed + 1)
    for i in range(steps):
        if (i + 1) * batch_size > len(order):
            order = np.concatenate([order, rng.permutation(size)])
        index = order[i * batch_size:(i + 1) * batch_size]
        key, sub = jax.random.split(key)
        params, opt_state, loss = step(params, opt_state,
                                       {k: v[index] for k, v in train.items()}, sub)
        losses.append(float(loss))
    predict = jax.jit(model.predict)
    out = {"train_loss": float(np.mean(losses[-10:]))}
    for split in splits:
        held = features(split, max_eval)
        hits = 0
        for start in range(0, len(held["label"]), 128):
            batch = {k: v[start:start + 128] for k, v in held.items()}
            hits += int(np.sum(np.asarray(predict(params, batch)) == batch["label"]))
        out[f"{split}_accuracy"] = hits / len(held["label"])
    return out


def evaluate_runs(model_dirs: Sequence[str], task: str = HELDOUT_TASK, batches: int = 20,
                  finetune: bool = False, finetune_steps: int = 100, seed: int = 0,
                  json_path: Optional[str] = None) -> Dict[str, Dict[str, float]]:
    """`t2t mlm_eval`: {model_dir: metrics} of each run, printed one line each (and
    written to `json_path`): `heldout_mlm`, and with `finetune` `finetune_accuracy` on the
    Bible WordPiece the tiny experiments pretrain on."""
    results = {}
    for model_dir in model_dirs:
        run = load_run(model_dir)
        metrics: Dict[str, Any] = heldout_mlm(run, task, max_batches=batches)
        if finetune:
            from t2t.data.catalog.bible import bible_wordpiece
            metrics.update(finetune_accuracy(run, bible_wordpiece(), steps=finetune_steps,
                                             seed=seed))
        results[model_dir] = metrics
        print(f"{model_dir}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else
                                           f"{k} {v}" for k, v in metrics.items()),
              flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return results
