"""The registry of model families (t2t/models/families.py): every family answers what the
rest of t2t asks of it, and a family defined here, in one file, trains through `t2t train`
once registered (docs/design.md, "How to add a model")."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from t2t.cli import main
from t2t.convert import pretrained
from t2t.data.converters import LMConverter
from t2t.models import families
from t2t.models.base import LossConfig, Model
from t2t.nn.config import TransformerConfig

CONFIG = TransformerConfig(vocab_size=128, d_model=16, num_heads=2, head_dim=8, d_ff=32,
                           num_encoder_layers=1, num_decoder_layers=1, max_length=32,
                           dtype="float32")
BUILT_IN = ["bert", "roberta", "longformer", "albert", "bigbird", "electra", "spanbert",
            "distill", "xlnet", "elmo", "t5", "bart", "gpt", "gpt1"]


# ----------------------------------------------------------------------- a toy family
class BigramLM(nn.Module):
    """Each token's logits over the next one from its own embedding alone."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, decoder_input_tokens, *, deterministic: bool = True):
        c = self.config
        init = nn.initializers.normal(0.02)
        table = self.param("embedding", nn.with_logical_partitioning(init, ("vocab", "embed")),
                           (c.vocab_size, c.d_model))
        out = self.param("output", nn.with_logical_partitioning(init, ("embed", "vocab")),
                         (c.d_model, c.vocab_size))
        return jnp.take(table, decoder_input_tokens, axis=0) @ out


class BigramModel(Model):
    family = "bigram"
    input_features = ("decoder_input_tokens",)

    def __init__(self, config: TransformerConfig, loss: LossConfig = LossConfig()):
        super().__init__(config, BigramLM(config), loss)


def bigram_flops(config, *, target_length, **_):
    return {"dense": 0.0, "attention": 0.0,
            "logits": 2.0 * target_length * config.d_model * config.vocab_size}


BIGRAM = families.Family(
    "bigram", "Bigram LM", BigramLM, BigramModel,
    lambda *, batch, length, **_: {"decoder_input_tokens": jnp.ones((batch, length), jnp.int32)},
    LMConverter, families.FlopFormula(decoder=True, forward=bigram_flops))


@pytest.fixture
def bigram():
    families.register(BIGRAM)
    yield BIGRAM
    families.unregister(BIGRAM.name)


def test_a_family_from_one_file_trains_through_t2t_train(bigram, tmp_path, capsys):
    assert main(["train", "--gin_file=experiments/gpt_tiny_bible.gin",
                 "--gin_file=models/gpt2/test.gin", "--gin.MODEL_FAMILY='bigram'",
                 f"--gin.MODEL_DIR='{tmp_path}'", "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=8",
                 "--gin.TASK_FEATURE_LENGTHS={'targets': 16}", "--gin.WARMUP_STEPS=1",
                 "--gin.TrainConfig.log_every=1", "--gin.TrainConfig.progress_bar=False",
                 "--gin.TrainConfig.async_checkpoint=False"]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss"] > 0 for r in rows)
    assert "stopped at step 2 (done)" in capsys.readouterr().out
    assert "MODEL_FAMILY = 'bigram'" in (tmp_path / "config.gin").read_text()
    assert families.count_params("bigram", CONFIG) == 2 * 128 * 16


# ----------------------------------------------------------------------- the built-in ones
def test_every_family_is_registered_once():
    assert families.names() == BUILT_IN
    assert families.names(variants=False) == [n for n in BUILT_IN
                                              if n not in ("roberta", "longformer", "albert",
                                                           "bigbird", "bart", "gpt1")]
    with pytest.raises(ValueError, match="already registered"):
        families.register(families.get("bert"))
    with pytest.raises(ValueError, match="unknown model family 'lstm'"):
        families.get("lstm")


@pytest.mark.parametrize("name", [n for n in BUILT_IN if n not in ("elmo", "distill")])
def test_module_inputs_and_wrapper_agree(name):
    """`example_inputs` initialise the family's module, whose wrapper names the family
    (a variant's wrapper is its base family's)."""
    fam = families.get(name)
    shapes = jax.eval_shape(lambda: families.make_module(name, CONFIG).init(
        jax.random.PRNGKey(0), **families.example_inputs(name)))
    assert shapes["params"]
    model = families.make_model(name, CONFIG)
    assert model.family == (fam.variant_of or name)


def test_a_student_family_needs_its_teacher():
    with pytest.raises(ValueError, match="needs a teacher"):
        families.make_model("distill", CONFIG)


def test_hugging_face_forms_belong_to_one_family_each():
    """Every model_type `t2t.convert.pretrained` reads is listed by exactly one family."""
    listed = [t for f in families.registered() for t in f.hf_model_types]
    assert sorted(listed) == sorted(pretrained.SUPPORTED)
    assert {t: pretrained.family_of(t) for t in ("roberta", "openai-gpt", "distilbert")} == {
        "roberta": "roberta", "openai-gpt": "gpt1", "distilbert": "distill"}


def test_heads_and_decoding_are_the_familys():
    from t2t.models.classifiers import SequenceClassifier
    from t2t.models.xlnet_heads import XLNetSequenceClassifier
    assert families.head("bert", "classification") is SequenceClassifier
    assert families.head("xlnet", "classification") is XLNetSequenceClassifier
    with pytest.raises(ValueError, match="'xlnet' family has no regression head; families "
                                         "with one: bert"):
        families.head("xlnet", "regression")
    assert families.names(lambda f: f.decoding, variants=False) == ["t5", "gpt"]
