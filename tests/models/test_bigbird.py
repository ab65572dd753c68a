"""The BigBird family (BERT's module and wrapper with block-sparse encoder attention): its
registration, MLM pretraining and classification fine-tuning of a tiny block-sparse model
on the CPU, inputs long enough for the sparse pattern (13 blocks of 4 > 5 + 2r)."""
import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.convert import pretrained
from t2t.models import families
from t2t.models.bert import BertPretrainingModel
from tests.models.test_classifiers import SIGNAL, bert_batch, padded_mlm_batch, sentences, train
from tests.nn.helpers import BERT_TINY

LENGTH, BLOCK = 52, 4   # 13 blocks (not d_ff = 48, which the jaxpr check would see)
BIGBIRD = BERT_TINY.replace(attention_pattern="block_sparse", sparse_block_size=BLOCK,
                            num_random_blocks=1, mlp_activations=("gelu_tanh",))


def test_bigbird_is_a_bert_variant_with_its_hugging_face_form():
    fam = families.get("bigbird")
    assert (fam.variant_of, fam.title, fam.hf_model_types, fam.masked_lm) == (
        "bert", "BigBird", ("big_bird",), True)
    assert pretrained.family_of("big_bird") == "bigbird"
    model = families.make_model("bigbird", BIGBIRD)
    assert isinstance(model, BertPretrainingModel) and model.family == "bert"


def _mlm_batch():
    return padded_mlm_batch(BIGBIRD.vocab_size, LENGTH, masked=7)


def _square_shapes(fn, *args):
    """Shapes of every value in `fn`'s jaxpr (nested ones included) ending in
    [LENGTH, LENGTH]: an l x l attention matrix."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            found.extend(v.aval.shape for v in eqn.outvars
                         if getattr(v.aval, "shape", ())[-2:] == (LENGTH, LENGTH))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)
    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_mlm_pretraining_learns_without_a_length_squared_matrix():
    model = families.make_model("bigbird", BIGBIRD)
    batch = _mlm_batch()
    params = jax.jit(model.init)(jax.random.PRNGKey(0), batch)   # one compile, not eager ops
    dense = families.make_model("bigbird", BIGBIRD.replace(attention_pattern="dense"))
    assert _square_shapes(lambda p: dense.loss_fn(p, batch), params)      # dense: l x l
    assert not _square_shapes(lambda p: model.loss_fn(p, batch), params)  # block-sparse: none
    _, losses = train(model, params, batch, steps=60, lr=3e-3)
    print(f"BigBird MLM loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all()
    assert losses[-1] < 0.1 * losses[0]


def test_classification_finetunes_from_the_pretrained_tree():
    pretraining = families.make_model("bigbird", BIGBIRD)
    trunk = jax.jit(pretraining.init)(jax.random.PRNGKey(1), _mlm_batch())
    tokens, label = sentences(12, length=LENGTH, seed=3)
    batch = bert_batch(tokens, label=label)
    model = families.head("bigbird", "classification")(BIGBIRD, num_classes=2)
    params = model.init_from_pretrained(jax.random.PRNGKey(0), batch, trunk)
    params, trunk = nn.unbox(params), nn.unbox(trunk)
    jax.tree.map(np.testing.assert_array_equal, params["encoder"], trunk["encoder"])
    _, losses, (pred, _) = train(model, params, batch, steps=50,
                                 then=lambda p: (model.predict(p, batch), None))
    print(f"BigBird classification loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert losses[-1] < 0.05 * losses[0]
    assert float(jnp.mean(pred == label)) == 1.0


@pytest.mark.slow    # `t2t train` compiles a training step (~35 s on 2 cores)
def test_bible_experiment_trains_and_converts_to_transformers(tmp_path):
    """experiments/bigbird_tiny_bible.gin (shrunk) trains 2 steps through `t2t train` on
    96-token rows (12 blocks of 8 > 5 + 2 * 3: block-sparse), `t2t convert` writes a
    BigBirdForMaskedLM (attention_type block_sparse) and, on rows short enough that both
    attend densely (transformers' fallback and t2t's), transformers' logits are t2t's."""
    import torch
    import transformers

    from t2t.cli import main
    from t2t.models.bert import BertModel
    from t2t.run import configurables, gin_utils
    from t2t.train.checkpoints import restore_params
    from tests.convert.helpers import hf_logits, padded_batch

    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--gin_file=experiments/bigbird_tiny_bible.gin",
                 f"--gin.MODEL_DIR={run}", "--gin.TRAIN_STEPS=2", "--gin.BATCH_SIZE=8",
                 "--gin.WARMUP_STEPS=1",
                 "--gin.TASK_FEATURE_LENGTHS={'inputs': 96, 'max_predictions': 12}",
                 "--gin.TransformerConfig.d_model=16", "--gin.TransformerConfig.d_ff=32",
                 "--gin.TransformerConfig.head_dim=8", "--gin.TrainConfig.progress_bar=False",
                 "--gin.TrainConfig.async_checkpoint=False"]) == 0
    assert main(["convert", str(run), str(out), "--model_type", "big_bird"]) == 0
    hf = transformers.BigBirdForMaskedLM.from_pretrained(out).eval()
    assert (hf.config.attention_type, hf.config.block_size, hf.config.num_random_blocks) == (
        "block_sparse", 8, 3)
    params = restore_params(str(run))
    gin_utils.parse([str(run / "config.gin")], [])
    vocab = params["token_embedder"]["embedding"].shape[0]
    config = configurables.TransformerConfig().replace(dtype="float32", vocab_size=vocab)
    assert config.attention_pattern == "block_sparse"
    ids, mask = padded_batch(5, vocab, 24, 0, ends=(None, 17, 9))
    ours = np.asarray(BertModel(config).apply({"params": params}, ids, mask,
                                              method=BertModel.mlm_logits))
    with torch.no_grad():
        diff = np.abs(hf_logits(hf, ids, mask) - ours)[mask.astype(bool)].max()
    print(f"bigbird run -> HF: max|logit diff| {diff:.3g}")
    assert diff < 1e-5


@pytest.mark.parametrize("size, hf_sizes", [
    ("base", {}),
    ("large", dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=4096))])
def test_presets_count_transformers_bigbird_for_pretraining(size, hf_sizes):
    """configs/models/bigbird/{base,large}.gin hold as many parameters as transformers'
    BigBirdForPreTraining (MLM and NSP heads, as t2t's pretraining tree) at those sizes
    (bigbird-roberta-base's defaults; large: its 24 x 1024 shape)."""
    import torch
    import transformers

    from tests.models.test_presets import params_of
    with torch.device("meta"):
        hf = transformers.BigBirdForPreTraining(transformers.BigBirdConfig(**hf_sizes))
    assert params_of(f"models/bigbird/{size}.gin") == sum(p.numel() for p in hf.parameters())


def test_packed_examples_do_not_see_each_other():
    """Two examples packed in one row (encoder_segment_ids 1 then 2): changing the second's
    tokens leaves the first's hidden states exactly as they were, and changes its own."""
    from t2t.models.bert import BertModel
    rng = np.random.default_rng(0)
    tokens = rng.integers(SIGNAL + 1, BIGBIRD.vocab_size, (1, LENGTH)).astype(np.int32)
    segments = np.where(np.arange(LENGTH) < 30, 1, 2)[None].astype(np.int32)
    other = tokens.copy()
    other[0, 30:] = rng.integers(SIGNAL + 1, BIGBIRD.vocab_size, LENGTH - 30)
    model = BertModel(BIGBIRD)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens, segments)
    encode = jax.jit(lambda t: model.apply(params, t, segments, method=BertModel.encode))
    a, b = np.asarray(encode(tokens)), np.asarray(encode(other))
    np.testing.assert_array_equal(a[0, :30], b[0, :30])
    assert np.abs(a[0, 30:] - b[0, 30:]).max() > 1e-3
