"""BigBird parity: tiny random transformers BigBird models (BigBirdModel, BigBirdForMaskedLM)
through the one loader, original_full against transformers on padded batches, exact round
trips of both attention types, and block-sparse attention against transformers' own
block-sparse layer run with its eval-mode plan (every random block = block 0)."""
import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers as t

from t2t.convert import pretrained
from t2t.convert.hf_bigbird import bigbird_config, bigbird_hf_config
from t2t.convert.hf_files import read_safetensors
from t2t.models.bert import BertModel
from t2t.nn.block_sparse import block_sparse_attention, block_sparse_mask, random_block_plan
from tests.convert.helpers import hf_logits, padded_batch, perturb

V, TOL = 96, 1e-5


def _hf_model(cls, tmp_path, **fields):
    torch.manual_seed(0)
    config = t.BigBirdConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, initializer_range=0.2, **fields)
    model = getattr(t, cls)(config).eval()
    perturb(model)
    model.save_pretrained(tmp_path, safe_serialization=True)
    return model


@pytest.mark.parametrize("cls, rescale", [("BigBirdForMaskedLM", True),
                                          ("BigBirdModel", False)])
def test_original_full_equals_transformers_on_a_padded_batch(cls, rescale, tmp_path):
    model = _hf_model(cls, tmp_path, attention_type="original_full", rescale_embeddings=rescale)
    ids, mask = padded_batch(3, V, 30, pad_id=0)
    types = (np.arange(30)[None] >= 12).astype(np.int64) * mask
    loaded = pretrained.load_pretrained(tmp_path)
    assert (loaded.architecture, loaded.config.attention_pattern,
            loaded.config.scale_embeddings) == (cls, "dense", rescale)
    real = mask.astype(bool)
    with torch.no_grad():
        out = (model.bert if cls == "BigBirdForMaskedLM" else model)(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
            token_type_ids=torch.tensor(types))
    hidden = loaded.hidden_states(ids, mask, types)
    diff = np.abs(hidden - out.last_hidden_state.numpy())[real].max()
    pooled = BertModel(loaded.config).apply({"params": loaded.params}, jnp.asarray(hidden),
                                            method=lambda m, h: m.pooler(h))
    diff_pooled = np.abs(np.asarray(pooled) - out.pooler_output.numpy()).max()
    print(f"{cls}: max|hidden diff| = {diff:.3g}, max|pooler diff| = {diff_pooled:.3g}")
    assert diff < TOL and diff_pooled < TOL
    if cls == "BigBirdForMaskedLM":
        logits = loaded.logits(ids, mask, types)
        diff = np.abs(logits - hf_logits(model, ids, mask, token_type_ids=types))[real].max()
        print(f"{cls}: max|logit diff| = {diff:.3g}")
        assert diff < TOL


@pytest.mark.parametrize("cls, fields", [
    ("BigBirdForMaskedLM", dict(attention_type="block_sparse", block_size=8,
                                num_random_blocks=2)),
    ("BigBirdModel", dict(attention_type="original_full", block_size=16, num_random_blocks=1,
                          rescale_embeddings=True))])
def test_round_trip_is_exact_and_carries_the_attention(cls, fields, tmp_path):
    _hf_model(cls, tmp_path / "hf", **fields)
    loaded = pretrained.load_pretrained(tmp_path / "hf")
    c = loaded.config
    assert (c.sparse_block_size, c.num_random_blocks) == (fields["block_size"],
                                                          fields["num_random_blocks"])
    pretrained.save_pretrained(loaded, tmp_path / "out")
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == [cls] and written["model_type"] == "big_bird"
    for key, value in fields.items():
        assert written[key] == value, key
    original, saved = read_safetensors(tmp_path / "hf"), read_safetensors(tmp_path / "out")
    original.pop("cls.predictions.decoder.weight", None)       # tied: HF writes it or not
    saved.pop("cls.predictions.decoder.weight", None)
    assert sorted(original) == sorted(saved)
    for name, value in original.items():
        np.testing.assert_array_equal(saved[name], value, err_msg=name)
    again = pretrained.load_pretrained(tmp_path / "out")
    assert again.config == c
    reread = getattr(t, cls).from_pretrained(tmp_path / "out").eval()
    assert reread.config.attention_type == fields["attention_type"]


def test_block_sparse_equals_transformers_where_both_attend_densely(tmp_path):
    """Inputs of at most (5 + 2r) blocks: transformers falls back to original_full and t2t
    to dense attention over the valid tokens, so a block_sparse checkpoint's logits agree."""
    bs, r = 4, 1
    model = _hf_model("BigBirdForMaskedLM", tmp_path, attention_type="block_sparse",
                      block_size=bs, num_random_blocks=r)
    loaded = pretrained.load_pretrained(tmp_path)
    ids, mask = padded_batch(3, V, (5 + 2 * r) * bs, pad_id=0, ends=(None, 17, 5))
    diff = np.abs(loaded.logits(ids, mask) - hf_logits(model, ids, mask))[mask == 1].max()
    print(f"block_sparse checkpoint, {ids.shape[1]} tokens (dense on both sides): "
          f"max|logit diff| = {diff:.3g}")
    assert diff < TOL
    assert model.bert.attention_type == "original_full"     # transformers' own fallback


def test_block_sparse_attention_equals_transformers_eval_plan(tmp_path):
    """transformers' block-sparse layer in eval mode attends each middle query block to its
    window, the first and last blocks and r copies of block 0; t2t's
    `block_sparse_attention` with that plan (all zeros) gives the same context, padding
    to whole blocks included. (num_random_blocks=0, where both would attend the same blocks,
    fails inside transformers: it cannot reshape its 0 random blocks.)"""
    bs, r, length = 4, 2, 42                      # padded by transformers to 44 = 11 blocks
    model = _hf_model("BigBirdModel", tmp_path, attention_type="block_sparse", block_size=bs,
                      num_random_blocks=r)
    ids, mask = padded_batch(3, V, length, pad_id=0, ends=(None, 33, 37))
    layer = model.encoder.layer[1].attention.self
    seen = {}
    layer.register_forward_hook(
        lambda module, args, output: seen.update(x=args[0], context=output[0]))
    with torch.no_grad():
        model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    assert model.attention_type == "block_sparse"
    x = seen["x"].numpy()
    padded = x.shape[1]
    assert padded == 44
    valid = np.pad(mask, ((0, 0), (0, padded - length))).astype(bool)

    def heads(linear):
        y = x @ linear.weight.detach().numpy().T + linear.bias.detach().numpy()
        return jnp.asarray(y.reshape(3, padded, 4, 8))
    q, k, v = heads(layer.query), heads(layer.key), heads(layer.value)
    plan = np.zeros((4, padded // bs, r), np.int32)       # transformers' eval-mode plan
    out = block_sparse_attention(q, k, v, jnp.asarray(valid), block_size=bs, plan=plan,
                                 scale=8 ** -0.5, dtype=jnp.float32)
    ref = seen["context"].numpy().reshape(3, padded, 4, 8)
    diff = np.abs(np.asarray(out) - ref)[valid].max()
    print(f"block-sparse context vs transformers (eval plan): max|diff| = {diff:.3g}")
    assert diff < TOL


def test_configs_t2t_cannot_read_or_write_are_one_line_errors(tmp_path):
    _hf_model("BigBirdModel", tmp_path, attention_type="original_full", use_bias=False)
    with pytest.raises(pretrained.PretrainedError, match="use_bias=False"):
        pretrained.load_pretrained(tmp_path)
    config = bigbird_config({"vocab_size": V, "hidden_size": 32, "num_attention_heads": 4,
                             "intermediate_size": 64, "num_hidden_layers": 1})
    assert (config.attention_pattern, config.sparse_block_size, config.max_length,
            config.mlp_activations) == ("block_sparse", 64, 4096, ("gelu_tanh",))
    with pytest.raises(ValueError, match="attention_pattern='sliding_window'"):
        bigbird_hf_config(config.replace(attention_pattern="sliding_window"))


@pytest.mark.parametrize("seed", [0, 5])
def test_block_sparse_model_equals_dense_attention_under_the_papers_mask(seed, tmp_path):
    """t2t's BigBird (block_sparse, its own seeded plan per layer and head) against
    transformers' original_full layers whose attention mask is replaced, layer by layer, by
    the explicit `block_sparse_mask` of the same plan: the paper's pattern, computed
    densely."""
    bs, r, length, heads = 4, 1, 40, 4                   # 10 blocks > 5 + 2r
    _hf_model("BigBirdForMaskedLM", tmp_path, attention_type="block_sparse", block_size=bs,
              num_random_blocks=r)
    loaded = pretrained.load_pretrained(tmp_path, random_blocks_seed=seed)
    assert loaded.config.attention_pattern == "block_sparse"
    dense = t.BigBirdForMaskedLM.from_pretrained(tmp_path, attention_type="original_full")
    dense.eval()
    ids, mask = padded_batch(3, V, length, pad_id=0, ends=(None, 29, 35))
    valid = jnp.asarray(mask.astype(bool))
    for i, layer in enumerate(dense.bert.encoder.layer):
        plan = random_block_plan(length // bs, heads, r, seed=seed, layer_index=i)
        allowed = np.asarray(block_sparse_mask(length, bs, plan, valid))
        additive = torch.tensor(np.where(allowed, 0.0, -1e9), dtype=torch.float32)

        def paper_mask(module, args, kwargs, additive=additive):
            return args, {**kwargs, "attention_mask": additive}
        layer.attention.self.register_forward_pre_hook(paper_mask, with_kwargs=True)
    logits = loaded.logits(ids, mask)
    ref = hf_logits(dense, ids, mask)
    real = mask.astype(bool)
    diff = np.abs(logits - ref)[real].max()
    print(f"block-sparse BigBird (seed {seed}) vs dense under its mask: max|diff| = {diff:.3g}")
    assert diff < TOL
    full = t.BigBirdForMaskedLM.from_pretrained(tmp_path, attention_type="original_full")
    unmasked = hf_logits(full.eval(), ids, mask)    # the pattern matters: full attention differs
    assert np.abs(logits - unmasked)[real].max() > 1e-3
