"""`t2t.run.encoder_eval`: the held-out MLM loss equals each pretraining model's own MLM
loss on the same batch, every system sees the same masked tokens, ELECTRA is scored by its
generator and fine-tuned from its discriminator, and the fine-tuning learns."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.data import converters as conv
import t2t.data.catalog.bible_successors  # noqa: F401  registers the held-out task
from t2t.data import tasks as tasks_lib
from t2t.models.bert import BertPretrainingModel
from t2t.models.electra import ElectraPretrainingModel
from t2t.nn.config import TransformerConfig
from t2t.run import encoder_eval

TASK = encoder_eval.HELDOUT_TASK
LENGTHS = {"inputs": 32, "max_predictions": 5}


def _config(vocab):
    return TransformerConfig(
        vocab_size=vocab, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1,
        num_decoder_layers=0, mlp_activations=("gelu",), norm_type="layer", norm_eps=1e-12,
        pre_norm=False, use_bias=True, position_embedding="learned", max_length=64,
        type_vocab_size=2, embedding_norm=True, dropout_rate=0.0, kernel_init="normal",
        initializer_range=0.2, dtype="float32")


@pytest.fixture(scope="module")
def batch():
    task = tasks_lib.get_task(TASK)
    data = task.get_pipeline(conv.EncoderConverter(LENGTHS, pack=True, nsp=False), 4, 0,
                             shuffle=False, num_epochs=1)
    return {k: jnp.asarray(v) for k, v in next(iter(data)).items()}, task.vocabulary


def _run(family, model, vocab_size, batch, generator=None):
    params = nn.unbox(model.init(jax.random.PRNGKey(0), batch))
    return encoder_eval.EncoderRun("/nowhere", family, model.config, params, generator)


@pytest.mark.parametrize("family", ["bert", "electra"])
def test_heldout_loss_is_the_models_own_mlm_loss(batch, family):
    batch, vocab = batch
    config = _config(vocab.padded_vocab_size)
    if family == "bert":
        model = BertPretrainingModel(config)
        run = _run(family, model, vocab.padded_vocab_size, batch)
    else:
        config = config.replace(embedding_dim=8, project_summed_embeddings=True)
        model = ElectraPretrainingModel(config, generator_size=0.5)
        run = _run(family, model, vocab.padded_vocab_size, batch, model.generator_config)
    got = encoder_eval.heldout_mlm(run, TASK, batch_size=4, max_batches=1,
                                   length=LENGTHS["inputs"],
                                   max_predictions=LENGTHS["max_predictions"])
    _, metrics = model.loss_fn(run.params, batch)         # rng None: deterministic
    np.testing.assert_allclose(got["mlm_loss"], metrics["mlm_loss"], rtol=1e-5)
    np.testing.assert_allclose(got["mlm_accuracy"], metrics["mlm_accuracy"], atol=1e-6)
    assert got["tokens"] == int(batch["masked_weights"].sum()) > 0


def test_every_system_sees_the_same_masked_tokens(batch):
    """Two passes (as for two runs) give identical batches: masking is fixed by the seed."""
    task = tasks_lib.get_task(TASK)
    first, second = (next(iter(task.get_pipeline(
        conv.EncoderConverter(LENGTHS, pack=True, nsp=False), 4, 0, shuffle=False,
        num_epochs=1))) for _ in range(2))
    for key in ("encoder_input_tokens", "masked_positions", "masked_ids"):
        np.testing.assert_array_equal(first[key], second[key])


def test_electra_fine_tunes_its_discriminator_and_the_fine_tuning_learns(batch):
    batch, vocab = batch
    config = _config(vocab.padded_vocab_size).replace(embedding_dim=8,
                                                      project_summed_embeddings=True)
    model = ElectraPretrainingModel(config, generator_size=0.5)
    run = _run("electra", model, vocab.padded_vocab_size, batch, model.generator_config)
    trunk_config, trunk = encoder_eval.encoder_trunk(run)
    assert set(trunk) == {"token_embedder", "encoder", "rtd_head"}
    np.testing.assert_array_equal(trunk["encoder"]["layers"]["layer_0"]["mlp"]["wi"]["kernel"],
                                  run.params["discriminator"]["layers"]["layer_0"]["mlp"]["wi"][
                                      "kernel"])
    assert trunk_config.d_model == 16 and trunk_config.embedding_dim == 8
    quick = dict(task="bible_paraphrase_kjv_web", max_length=48, max_train=32, max_eval=64,
                 batch_size=16, splits=("test",))
    none = encoder_eval.finetune_accuracy(run, vocab, steps=1, learning_rate=0.0, **quick)
    some = encoder_eval.finetune_accuracy(run, vocab, steps=80, learning_rate=3e-3, **quick)
    assert 0.0 <= none["test_accuracy"] <= 1.0 and 0.0 <= some["test_accuracy"] <= 1.0
    assert none["train_loss"] > 0.6 and some["train_loss"] < 0.3, (none, some)  # memorised
