"""LoRA (merge maths for every kernel layout, exact start, only factors and head train),
prompt tuning (exact insertion, only prompts train), frozen leaves kept out of the optimizer,
measured state bytes: the building blocks (t2t.models.peft) through the run layer's wrappers
(t2t.models.lightweight)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from t2t.errors import ConfigError
from t2t.run import gin_utils
from t2t.models import classifiers as C
from t2t.models import lightweight as L
from t2t.models import peft
from t2t.models.gpt import DecoderOnlyModel
from t2t.run import configurables as configured
from t2t.nn.stacks import Decoder

from tests.models.test_classifiers import (BERT, GPT, bert_batch, bert_trunk, jit,
                                           random_params, sentences, tagging_batch, train)

# Kernel name -> how many of its leading dims are the input (the rest are the output).
INPUT_DIMS = {"query": 1, "key": 1, "value": 1, "out": 2, "wi": 1, "wo": 1}


def classifier_params(batch, seed=0, std=0.02):
    """A SequenceClassifier tree: random 'pretrained' trunk, fresh head (no compile)."""
    model = C.SequenceClassifier(BERT, 2)
    params = random_params(model.init, jax.random.PRNGKey(0), batch, seed=seed, std=std)
    return model, params


def train_frozen(model, tree, batch, steps, lr):
    """`steps` full-batch Adam steps through `peft.freeze(tx, model.is_frozen)` (as
    `t2t finetune` does) in one compiled scan -> (tree, losses [steps])."""
    tree, ls = train(model, tree, batch, steps, lr, frozen=model.is_frozen)
    return jax.device_get(tree), ls


def assert_only_trainable_moved(model, before, after):
    for path, old in traverse_util.flatten_dict(before).items():
        name = "/".join(path)
        new = traverse_util.flatten_dict(after)[path]
        if model.is_frozen(name):
            np.testing.assert_array_equal(new, old, err_msg=name)
        else:
            assert not np.array_equal(new, old), f"{name} did not train"


# ----------------------------------------------------------------------------- LoRA
def test_lora_merge_is_w_plus_scaled_ab_for_every_kernel_layout():
    """`LoraTuning.to_base` on every attention and MLP kernel: W + (α/r)·A@B, with A@B's
    rows the kernel's input dims (query/key/value: embed; out: heads × head_dim; MLP: in)
    and its columns the output dims; B = 0 gives exactly the base; nothing else changes."""
    batch = bert_batch(sentences(2)[0])
    base, params = classifier_params(batch)
    model = L.LoraTuning(base, rank=4, alpha=8.0, targets=peft.ATTENTION_TARGETS
                         + peft.MLP_TARGETS)
    lora = jit(model.init_extra, jax.random.PRNGKey(1), params)["lora"]
    layer = lora["encoder"]["layers"]["layer_0"]
    shapes = {k: (v["lora_a"].shape, v["lora_b"].shape) for k, v in
              {**layer["self_attention"], **layer["mlp"]}.items()}
    d, hd, ff = BERT.d_model, BERT.num_heads * BERT.head_dim, BERT.d_ff
    assert shapes == {"query": ((d, 4), (4, hd)), "key": ((d, 4), (4, hd)),
                      "value": ((d, 4), (4, hd)), "out": ((hd, 4), (4, d)),
                      "wi": ((d, 4), (4, ff)), "wo": ((ff, 4), (4, d))}
    assert set(lora) == {"encoder"}                              # only the named kernels
    to_base = jax.jit(model.to_base)
    # B = 0: the merge is exactly the base.
    jax.tree.map(np.testing.assert_array_equal, to_base({**params, "lora": lora}), params)
    rng = np.random.default_rng(0)
    lora = jax.tree_util.tree_map_with_path(
        lambda p, x: rng.standard_normal(x.shape).astype(np.float32)
        if p[-1].key == "lora_b" else np.asarray(x), lora)
    merged = to_base({**params, "lora": lora})
    for scale, got in ((2.0, merged), (0.5, jax.jit(peft.merge_lora)(params, lora, 0.5))):
        checked = set()
        for path, factors in traverse_util.flatten_dict(lora).items():
            if path[-1] != "lora_a":
                continue
            module = path[:-1]
            w = traverse_util.flatten_dict(params)[module + ("kernel",)]
            b = traverse_util.flatten_dict(lora)[module + ("lora_b",)]
            n_in = INPUT_DIMS[module[-1]]
            a = factors.reshape(w.shape[:n_in] + (4,))             # [*in_dims, r]
            delta = np.tensordot(a, b.reshape((4,) + w.shape[n_in:]), 1)   # [*in, *out]
            new = traverse_util.flatten_dict(got)[module + ("kernel",)]
            assert new.shape == w.shape
            np.testing.assert_allclose(new - w, scale * delta, rtol=1e-5, atol=1e-5)
            checked.add(module[-1])
        assert checked == set(INPUT_DIMS)
    for name in ("pooler", "classifier", "token_embedder"):
        jax.tree.map(np.testing.assert_array_equal, merged[name], params[name])


def test_lora_under_scan_layers_adapts_each_layer():
    cfg = BERT.replace(scan_layers=True)
    params = bert_trunk(cfg)
    lora = jit(lambda r, p: peft.init_lora(r, p, ("query", "wo"), rank=2),
               jax.random.PRNGKey(0), params)
    q = lora["encoder"]["layers"]["layer"]["self_attention"]["query"]
    wo = lora["encoder"]["layers"]["layer"]["mlp"]["wo"]
    assert q["lora_a"].shape == (2, cfg.d_model, 2) and q["lora_b"].shape == (2, 2, 32)
    assert wo["lora_a"].shape == (2, cfg.d_ff, 2)
    q = dict(q, lora_b=np.ones(q["lora_b"].shape, np.float32))
    lora["encoder"]["layers"]["layer"]["self_attention"]["query"] = q
    merged = jit(peft.merge_lora, params, lora, 1.0)
    k = merged["encoder"]["layers"]["layer"]["self_attention"]["query"]["kernel"]
    base = params["encoder"]["layers"]["layer"]["self_attention"]["query"]["kernel"]
    assert k.shape == base.shape == (2, cfg.d_model, cfg.num_heads, cfg.head_dim)
    for layer in range(2):
        np.testing.assert_allclose(k[layer] - base[layer],
                                   (np.asarray(q["lora_a"][layer]) @ q["lora_b"][layer]
                                    ).reshape(base.shape[1:]),
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        peft.init_lora(jax.random.PRNGKey(0), params, ("qkv",), rank=2)


def test_lora_starts_exactly_as_the_base_model_and_trains_only_factors_and_head():
    """From a pretrained tree: B = 0 gives exactly the base model's parameters and outputs;
    the optimizer state covers only the factors and the head; training moves only those
    (the merged query kernels, not the key or MLP ones) and fits the labels."""
    tokens, label = sentences(32, seed=6)
    batch = bert_batch(tokens, label=label)
    base, params = classifier_params(batch)
    model = L.LoraTuning(base, rank=4, alpha=8.0, targets=("query", "value"),
                         train_modules=("classifier",))
    tree = nn.unbox(jit(model.init_from_pretrained, jax.random.PRNGKey(0), batch, params))
    assert set(tree) == set(params) | {"lora"}
    jax.tree.map(np.testing.assert_array_equal, {k: tree[k] for k in params}, params)
    jax.tree.map(np.testing.assert_array_equal, jax.jit(model.to_base)(tree), params)
    forward = jax.jit(base.apply)
    np.testing.assert_allclose(jit(model.apply, tree, batch), forward(params, batch),
                               rtol=1e-6, atol=1e-7)
    # The optimizer state covers only the trainable leaves (Adam: two moments each).
    trainable = {"lora": tree["lora"], "classifier": tree["classifier"]}
    tx = peft.freeze(optax.adam(3e-3), model.is_frozen)
    assert peft.optimizer_state_bytes(tx, tree) == 2 * peft.tree_bytes(trainable) + 4
    d, hd = BERT.d_model, BERT.num_heads * BERT.head_dim
    assert model.trainable_count(tree) == BERT.num_encoder_layers * 2 * 4 * (d + hd) + d * 2 + 2
    mu = jax.eval_shape(tx.init, tree)[0].mu
    leaves = {jax.tree_util.keystr(p, simple=True, separator="/")
              for p, _ in jax.tree_util.tree_leaves_with_path(mu)}
    assert leaves == {"/".join(p) for p in traverse_util.flatten_dict(trainable)}

    new, ls = train_frozen(model, tree, batch, steps=30, lr=3e-2)
    assert ls[-1] < 0.3 * ls[0]
    assert_only_trainable_moved(model, tree, new)
    merged = jax.device_get(jax.jit(model.to_base)(new))
    layer, base_layer = (t["encoder"]["layers"]["layer_0"] for t in (merged, params))
    assert float(np.abs(layer["self_attention"]["query"]["kernel"]
                        - base_layer["self_attention"]["query"]["kernel"]).max()) > 0
    jax.tree.map(np.testing.assert_array_equal, layer["self_attention"]["key"],
                 base_layer["self_attention"]["key"])
    jax.tree.map(np.testing.assert_array_equal, layer["mlp"], base_layer["mlp"])


def test_optimizer_state_bytes_bert_base_full_vs_lora(capsys):
    """Measured with jax.eval_shape (nothing allocated): AdamW on BERT-base + a 2-class head,
    full fine-tuning vs `LoraTuning` r=8 on query/value (+ the classifier), frozen as
    `t2t finetune` freezes it."""
    gin_utils.parse(["models/bert/base.gin"])
    config = configured.TransformerConfig()
    batch = bert_batch(np.ones((1, 128), np.int32), label=np.zeros(1, np.int32))
    base = C.SequenceClassifier(config, 2)
    full = nn.unbox(jax.eval_shape(base.init, jax.random.PRNGKey(0), batch))
    model = L.LoraTuning(base, rank=8, targets=("query", "value"),
                         train_modules=("classifier",))
    tree = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), batch))
    full_bytes = peft.optimizer_state_bytes(optax.adamw(1e-4), full)
    lora_bytes = peft.optimizer_state_bytes(peft.freeze(optax.adamw(1e-4), model.is_frozen),
                                            tree)
    n_full = sum(x.size for x in jax.tree.leaves(full))
    n_lora = model.trainable_count(tree)
    assert n_full == 109_483_778
    assert n_lora == 12 * 2 * (768 * 8 + 8 * 768) + 768 * 2 + 2
    assert full_bytes == 8 * n_full + 4 and lora_bytes == 8 * n_lora + 4
    with capsys.disabled():
        print(f"\nAdamW state, BERT-base classifier: full {full_bytes / 2**20:.1f} MiB "
              f"({n_full:,} params) vs LoRA r=8 q,v + head {lora_bytes / 2**20:.2f} MiB "
              f"({n_lora:,} params): {full_bytes / lora_bytes:.0f}x smaller")


def test_freeze_keeps_frozen_leaves_out_of_the_state():
    batch = bert_batch(sentences(2)[0])
    _, params = classifier_params(batch)
    tx = peft.freeze(optax.adam(1e-3), ("token_embedder", "encoder"))
    head = {k: params[k] for k in ("pooler", "classifier")}
    assert peft.optimizer_state_bytes(tx, params) == 2 * peft.tree_bytes(head) + 4
    grads = jax.tree.map(np.ones_like, params)
    updates = jit(lambda g, p: tx.update(g, tx.init(p), p)[0], grads, params)
    assert all(float(jnp.abs(u).max()) == 0 for u in jax.tree.leaves(updates["encoder"]))
    assert float(jnp.abs(updates["classifier"]["dense"]["kernel"]).min()) > 0


def test_frozen_optimizer_state_checkpoints_and_restores(tmp_path):
    """`t2t finetune` saves the frozen run's Adam state with orbax, which refuses zero-size
    arrays: frozen leaves hold no array at all, and the state round-trips."""
    from t2t.train import optimizers
    from t2t.train.checkpoints import Checkpointer
    params = {"encoder": {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))}},
              "classifier": {"kernel": jnp.full((2, 2), 0.5), "bias": jnp.zeros((2,))}}
    tx = peft.freeze(optimizers.adamw_bert(1e-3), ("encoder",))
    grads = jax.tree.map(jnp.ones_like, params)
    state = tx.update(grads, tx.init(params), params)[1]
    assert all(x.size for x in jax.tree.leaves(state))
    with Checkpointer(str(tmp_path), async_save=False) as ckpt:
        ckpt.save(1, {"opt_state": state}, force=True)
        restored, _ = ckpt.restore(1, {"opt_state": tx.init(params)})   # target shapes
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored["opt_state"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------- prompts
def test_prompt_embeddings_act_as_prepended_tokens():
    """With prompts set to the embeddings of tokens t, the prompt-tuned model's outputs are
    the base model's on the row with t prepended, minus those positions (BERT tagger and
    GPT LM; unpacked rows with padding)."""
    batch = tagging_batch(n=4)
    batch["encoder_segment_ids"] = batch["encoder_segment_ids"].at[:, -2:].set(0)
    tagger = C.TokenTagger(BERT, 3)
    tparams = random_params(tagger.init, jax.random.PRNGKey(0), batch)
    lm = DecoderOnlyModel(GPT)
    gbatch = {"decoder_input_tokens": batch["encoder_input_tokens"],
              "decoder_segment_ids": batch["encoder_segment_ids"]}
    gparams = random_params(Decoder(GPT).init, jax.random.PRNGKey(0),
                            gbatch["decoder_input_tokens"])
    t = np.array([11, 12, 13], np.int32)
    pt, pg = L.PromptTuning(tagger, 3), L.PromptTuning(lm, 3)

    def prepended(b):
        out = {k: jnp.concatenate([jnp.broadcast_to(t if "tokens" in k else 1, (4, 3)), v], 1)
               for k, v in b.items() if k != "tag_labels"}
        if "token_type_ids" in out:
            out["token_type_ids"] = out["token_type_ids"].at[:, :3].set(0)
        return out

    def both(tp, gp):
        prompted_t = {**tp, "prompt": tp["token_embedder"]["embedding"][t]}
        prompted_g = {**gp, "prompt": gp["token_embedder"]["embedding"][t]}
        return (pt.apply(prompted_t, batch), tagger.apply(tp, prepended(batch))[:, 3:],
                pg.apply(prompted_g, gbatch), lm.apply(gp, prepended(gbatch))[:, 3:])

    tag_p, tag_ref, lm_p, lm_ref = jit(both, tparams, gparams)
    assert tag_p.shape == (4, 8, 3) and lm_p.shape == (4, 8, GPT.vocab_size)
    real = np.asarray(batch["encoder_segment_ids"]) > 0
    np.testing.assert_allclose(np.asarray(tag_p)[real], np.asarray(tag_ref)[real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(lm_p)[real], np.asarray(lm_ref)[real], atol=1e-5)


def test_prompt_tuning_trains_only_the_prompt():
    """Only the prompt trains (`train_modules=()`: the head stays frozen too), and it can
    steer a frozen classifier: every label is 1 and the base (random, std 0.3 so that its
    outputs respond to its inputs) starts near 0.56."""
    tokens, _ = sentences(32, seed=7)
    batch = bert_batch(tokens, label=np.ones(32, np.int32))
    base, params = classifier_params(batch, seed=1, std=0.3)
    model = L.PromptTuning(base, num_prompts=4, train_modules=())
    tree = {**params, **model.init_extra(jax.random.PRNGKey(0), params)}
    assert tree["prompt"].shape == (4, BERT.d_model)
    # init="vocab": every prompt is a row of the token table.
    table = params["token_embedder"]["embedding"]
    assert all(np.any(np.all(table == row, axis=1)) for row in np.asarray(tree["prompt"]))
    before, plain = jit(lambda t, p: (model.apply(t, batch), base.apply(p, batch)),
                        tree, params)
    assert before.shape == plain.shape == (32, 2)
    assert float(jnp.abs(before - plain).max()) > 1e-6            # the prompt changes outputs
    tx = peft.freeze(optax.adam(1e-2), model.is_frozen)
    assert model.trainable_count(tree) == 4 * BERT.d_model
    assert peft.optimizer_state_bytes(tx, tree) == 2 * 4 * 4 * 32 + 4
    new, ls = train_frozen(model, tree, batch, steps=30, lr=3e-2)
    assert ls[-1] < 0.2 * ls[0]
    assert_only_trainable_moved(model, tree, new)
    with pytest.raises(ConfigError, match=r"PromptTuning.train_modules names \['nope'\]"):
        jax.eval_shape(L.PromptTuning(base, 2, train_modules=("nope",)).init,
                       jax.random.PRNGKey(0), batch)
