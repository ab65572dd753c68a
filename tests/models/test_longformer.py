"""The Longformer family (BERT's module and wrappers with sliding-window attention and
global tokens): its registration, MLM pretraining and classification / QA fine-tuning of a
tiny model on the CPU, where the signal lies beyond the [CLS]'s local reach, so only its
global attention can see it."""
import importlib.util

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.convert import pretrained
from t2t.models import families
from t2t.models import longformer as lf
from t2t.models.bert import BertPretrainingModel
from tests.models.test_classifiers import CLS, SIGNAL, bert_batch, padded_mlm_batch, train
from tests.nn.helpers import BERT_TINY

LENGTH, WINDOW = 32, 4    # 2 layers x 2 tokens a side: [CLS] reaches position 4 locally
LONGFORMER = BERT_TINY.replace(attention_pattern="sliding_window", attention_window=(WINDOW,),
                               max_global_tokens=4, dropout_rate=0.0)


def test_longformer_is_a_bert_variant_with_its_hugging_face_form_and_heads():
    fam = families.get("longformer")
    assert (fam.variant_of, fam.title, fam.hf_model_types, fam.tokenizer) == (
        "bert", "Longformer", ("longformer",), "byte_bpe")
    assert pretrained.family_of("longformer") == "longformer"
    assert isinstance(families.make_model("longformer", LONGFORMER), BertPretrainingModel)
    head = families.head("longformer", "classification")
    assert head.func is lf.LongformerClassifier and head.keywords["style"].dropout_first
    assert families.head("longformer", "span_qa") is lf.LongformerSpanQA


def test_default_global_tokens():
    seg = jnp.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    tokens = jnp.ones_like(seg)
    np.testing.assert_array_equal(lf.first_tokens(tokens, seg),
                                  [[1, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(lf.first_tokens(tokens, None)[1], [1, 0, 0, 0, 0, 0])
    batch = {"encoder_input_tokens": tokens, "encoder_segment_ids": seg}
    context = jnp.array([[0, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]], bool)
    np.testing.assert_array_equal(lf.global_tokens_of(batch, "question", context),
                                  [[1, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]])
    given = jnp.zeros_like(seg).at[:, 3].set(1)
    assert lf.global_tokens_of({**batch, lf.GLOBAL_FEATURE: given}, "first") is given


def _mlm_batch():
    return padded_mlm_batch(LONGFORMER.vocab_size, LENGTH)


def test_mlm_pretraining_learns():
    model = families.make_model("longformer", LONGFORMER)
    batch = _mlm_batch()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch)   # jitted here and below:
    _, losses = train(model, params, batch, steps=60, lr=3e-3)  # one compile, not many eager ops
    print(f"Longformer MLM loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.1 * losses[0]


def _far_signal(n, seed):
    """[CLS] + filler; odd rows have token 5 somewhere past position 8, out of the [CLS]'s
    local reach after two layers."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(SIGNAL + 1, 64, (n, LENGTH)).astype(np.int32)
    tokens[:, 0] = CLS
    label = (np.arange(n) % 2).astype(np.int32)
    where = rng.integers(9, LENGTH, n)
    tokens[label == 1, where[label == 1]] = SIGNAL
    return tokens, label


def test_classification_sees_the_whole_input_through_the_global_cls():
    pretraining = families.make_model("longformer", LONGFORMER)
    trunk = jax.jit(pretraining.init)(jax.random.PRNGKey(1), _mlm_batch())
    tokens, label = _far_signal(12, seed=3)
    batch = bert_batch(tokens, label=label)
    model = families.head("longformer", "classification")(LONGFORMER, num_classes=2)
    params = model.init_from_pretrained(jax.random.PRNGKey(0), batch, trunk)
    params, trunk = nn.unbox(params), nn.unbox(trunk)
    jax.tree.map(np.testing.assert_array_equal, params["encoder"], trunk["encoder"])
    _, losses, pred = train(model, params, batch, steps=50,
                            then=lambda p: model.predict(p, batch))
    print(f"Longformer classification loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.05 * losses[0]
    assert float(jnp.mean(pred == label)) == 1.0
    # no global token: the [CLS] cannot see the signal, the logits do not depend on it
    local = {**batch, lf.GLOBAL_FEATURE: jnp.zeros_like(batch["encoder_input_tokens"])}
    filler = {**local, "encoder_input_tokens": jnp.where(
        batch["encoder_input_tokens"] == SIGNAL, SIGNAL + 1, batch["encoder_input_tokens"])}
    apply = jax.jit(model.apply)
    np.testing.assert_allclose(apply(params, local), apply(params, filler), atol=1e-6)


def test_span_qa_puts_global_attention_on_the_question():
    """The question (outside the context) is global: its tokens see the whole context."""
    tokens, _ = _far_signal(4, seed=5)
    context = np.zeros(tokens.shape, bool)
    context[:, 6:] = True
    batch = bert_batch(tokens, context_mask=context, start_positions=np.full(4, 10),
                       end_positions=np.full(4, 12))
    model = families.head("longformer", "span_qa")(LONGFORMER)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch))
    loss, _ = jax.jit(model.loss_fn)(params, batch)
    assert np.isfinite(loss)
    question = {**batch, lf.GLOBAL_FEATURE: jnp.asarray(~context)}
    none = {**batch, lf.GLOBAL_FEATURE: jnp.zeros(context.shape, jnp.int32)}
    apply = jax.jit(model.apply)
    default = apply(params, batch)["start_logits"]
    np.testing.assert_array_equal(default, apply(params, question)["start_logits"])
    assert not np.allclose(default, apply(params, none)["start_logits"])


@pytest.mark.slow
def test_tiny_bible_experiment_trains_through_t2t_train(tmp_path):
    """configs/experiments/longformer_tiny_bible.gin: the family, its windows and MLM
    through the whole pipeline (3 steps; ~40 s, most of it compiling)."""
    import json

    from t2t.run import experiment, gin_utils
    gin_utils.parse(["experiments/longformer_tiny_bible.gin"], [
        f"MODEL_DIR = '{tmp_path}'", "TRAIN_STEPS = 3", "BATCH_SIZE = 8",
        "TASK_FEATURE_LENGTHS = {'inputs': 64, 'max_predictions': 5}", "WARMUP_STEPS = 1",
        "TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
        "TrainConfig.async_checkpoint = False"])
    assert experiment.run().step == 3
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert all(np.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    operative = (tmp_path / "config.gin").read_text()
    assert "MODEL_FAMILY = 'longformer'" in operative
    assert "TransformerConfig.attention_window = (16, 32)" in operative


@pytest.mark.slow    # ~25 s: a whole train step compiled for a TPU slice
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed")
def test_the_train_step_compiles_for_a_tpu_slice_with_the_splash_kernel():
    """`t2t compile`'s AOT path: on a v4-8 (no attention dropout, 256-token rows) the
    windows run in the Pallas splash kernel, a Mosaic custom call in the compiled step."""
    from t2t.run import aot
    aot.parse_gin(["experiments/longformer_tiny_bible.gin", "hardware/tpu_v4_8.gin"], [
        "TASK_FEATURE_LENGTHS = {'inputs': 256, 'max_predictions': 20}", "BATCH_SIZE = 32",
        "TransformerConfig.scan_layers = False",
        "TransformerConfig.attention_dropout_rate = 0.0"])
    report = aot.compile_for(*aot.target_from_config(None, None))
    assert report.fits and report.num_chips == 4
    assert "tpu_custom_call" in report.compiled.as_text()
