"""LoRA (merge maths, exact start, only factors train), prompt tuning (exact insertion,
only prompts train), frozen leaves kept out of the optimizer, measured state bytes."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t2t.run import gin_utils
from t2t.models import classifiers as C
from t2t.models import peft
from t2t.models.gpt import DecoderOnlyModel
from t2t.run import configurables as configured
from t2t.nn.stacks import Decoder

from tests.models.test_classifiers import (BERT, GPT, bert_batch, bert_trunk, jit,
                                           random_params, sentences, tagging_batch, train)


def classifier_params(batch, seed=0, std=0.02):
    """A SequenceClassifier tree: random 'pretrained' trunk, fresh head (no compile)."""
    model = C.SequenceClassifier(BERT, 2)
    params = random_params(model.init, jax.random.PRNGKey(0), batch, seed=seed, std=std)
    return model, params


# ----------------------------------------------------------------------------- LoRA
def test_lora_factor_shapes_merge_and_scaling():
    batch = bert_batch(sentences(2)[0])
    _, params = classifier_params(batch)
    targets = peft.ATTENTION_TARGETS + peft.MLP_TARGETS
    lora = jit(lambda r, p: peft.init_lora(r, p, targets, rank=4), jax.random.PRNGKey(1), params)
    layer = lora["encoder"]["layers"]["layer_0"]
    shapes = {k: (v["lora_a"].shape, v["lora_b"].shape) for k, v in
              {**layer["self_attention"], **layer["mlp"]}.items()}
    d, hd, ff = BERT.d_model, BERT.num_heads * BERT.head_dim, BERT.d_ff
    assert shapes == {"query": ((d, 4), (4, hd)), "key": ((d, 4), (4, hd)),
                      "value": ((d, 4), (4, hd)), "out": ((hd, 4), (4, d)),
                      "wi": ((d, 4), (4, ff)), "wo": ((ff, 4), (4, d))}
    assert "classifier" not in lora and "pooler" not in lora     # only the named kernels
    merge = jax.jit(peft.merge_lora)
    # B = 0: the merge is exactly the base.
    jax.tree.map(np.testing.assert_array_equal, merge(params, lora, 2.0), params)
    # Random B: `out` [heads, head_dim, embed] takes its first two dims as "in".
    rng = np.random.default_rng(0)
    lora = jax.tree_util.tree_map_with_path(
        lambda p, x: rng.standard_normal(x.shape).astype(np.float32)
        if p[-1].key == "lora_b" else np.asarray(x), lora)
    a = lora["encoder"]["layers"]["layer_1"]["self_attention"]["out"]["lora_a"]
    b = lora["encoder"]["layers"]["layer_1"]["self_attention"]["out"]["lora_b"]
    base_w = params["encoder"]["layers"]["layer_1"]["self_attention"]["out"]["kernel"]
    expected = np.einsum("hdr,re->hde", a.reshape(BERT.num_heads, BERT.head_dim, 4), b)
    for scale in (0.5, 3.0):
        merged = merge(params, lora, scale)
        w = merged["encoder"]["layers"]["layer_1"]["self_attention"]["out"]["kernel"]
        assert w.shape == base_w.shape == (BERT.num_heads, BERT.head_dim, d)
        np.testing.assert_allclose(w - base_w, scale * expected, rtol=1e-5, atol=1e-5)
        q = merged["encoder"]["layers"]["layer_0"]["self_attention"]["query"]["kernel"]
        assert q.shape == (d, BERT.num_heads, BERT.head_dim)
        np.testing.assert_array_equal(merged["pooler"]["dense"]["kernel"],
                                      params["pooler"]["dense"]["kernel"])
    model = peft.LoraModel(C.SequenceClassifier(BERT, 2), rank=4, alpha=8.0, base_params=params)
    assert model.scale == 2.0 and model.targets == ("query", "value")


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


def test_lora_starts_exactly_as_the_base_model():
    tokens, label = sentences(32, seed=6)
    batch = bert_batch(tokens, label=label)
    base, params = classifier_params(batch)
    model = peft.LoraModel(base, rank=4, alpha=8.0, targets=("query", "value"),
                           base_params=params, train_modules=("classifier",))
    trainable = jit(model.init, jax.random.PRNGKey(0), batch)
    assert set(trainable) == {"lora", "modules"} and set(trainable["modules"]) == {"classifier"}
    # B = 0: exactly the base parameters, hence exactly the base model's outputs.
    merged = model.merged_params(trainable)
    jax.tree.map(np.testing.assert_array_equal, merged, params)
    forward = jax.jit(base.apply)
    np.testing.assert_array_equal(forward(merged, batch), forward(params, batch))
    # (model.apply closes over the frozen base: XLA may fold constants, so ~1 ulp.)
    np.testing.assert_allclose(jit(model.apply, trainable, batch), forward(params, batch),
                               rtol=1e-4, atol=1e-7)
    # The optimizer state covers only the trainable leaves (Adam: two moments each).
    tx = optax.adam(3e-3)
    assert peft.optimizer_state_bytes(tx, trainable) == 2 * peft.tree_bytes(trainable) + 4
    assert jax.tree.structure(jax.eval_shape(tx.init, trainable)[0].mu) == \
        jax.tree.structure(trainable)


def test_optimizer_state_bytes_bert_base_full_vs_lora(capsys):
    """Measured with jax.eval_shape (nothing allocated): AdamW on BERT-base + a 2-class head,
    full fine-tuning vs LoRA r=8 on query/value (+ the head)."""
    gin_utils.parse(["models/bert/base.gin"])
    config = configured.TransformerConfig()
    batch = bert_batch(np.ones((1, 128), np.int32), label=np.zeros(1, np.int32))
    full = jax.eval_shape(C.SequenceClassifier(config, 2).init, jax.random.PRNGKey(0), batch)
    full = nn.unbox(full)
    lora = jax.eval_shape(lambda r: peft.init_lora(r, full, ("query", "value"), 8),
                          jax.random.PRNGKey(0))
    trainable = {"lora": lora, "modules": {"classifier": full["classifier"]}}
    tx = optax.adamw(1e-4)
    full_bytes = peft.optimizer_state_bytes(tx, full)
    lora_bytes = peft.optimizer_state_bytes(tx, trainable)
    n_full = sum(x.size for x in jax.tree.leaves(full))
    n_lora = sum(x.size for x in jax.tree.leaves(trainable))
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

    def prepended(b):
        out = {k: jnp.concatenate([jnp.broadcast_to(t if "tokens" in k else 1, (4, 3)), v], 1)
               for k, v in b.items() if k != "tag_labels"}
        if "token_type_ids" in out:
            out["token_type_ids"] = out["token_type_ids"].at[:, :3].set(0)
        return out

    def both(tp, gp):
        pt = peft.PromptTuningModel(tagger, 3, base_params=tp)
        pg = peft.PromptTuningModel(lm, 3, base_params=gp)
        prompt_t = {"prompt": tp["token_embedder"]["embedding"][t]}
        prompt_g = {"prompt": gp["token_embedder"]["embedding"][t]}
        return (pt.apply(prompt_t, batch), tagger.apply(tp, prepended(batch))[:, 3:],
                pg.apply(prompt_g, gbatch), lm.apply(gp, prepended(gbatch))[:, 3:])

    tag_p, tag_ref, lm_p, lm_ref = jit(both, tparams, gparams)
    assert tag_p.shape == (4, 8, 3) and lm_p.shape == (4, 8, GPT.vocab_size)
    real = np.asarray(batch["encoder_segment_ids"]) > 0
    np.testing.assert_allclose(np.asarray(tag_p)[real], np.asarray(tag_ref)[real], atol=1e-5)
    np.testing.assert_allclose(np.asarray(lm_p)[real], np.asarray(lm_ref)[real], atol=1e-5)


def test_prompt_tuning_trains_only_the_prompt():
    """Only the prompt trains, and it can steer a frozen classifier: every label is 1 and
    the base (random, std 0.3 so that its outputs respond to its inputs) starts near 0.56."""
    tokens, _ = sentences(32, seed=7)
    batch = bert_batch(tokens, label=np.ones(32, np.int32))
    base, params = classifier_params(batch, seed=1, std=0.3)
    frozen_copy = jax.tree.map(np.copy, params)
    model = peft.PromptTuningModel(base, num_prompts=4, base_params=params)
    trainable = model.init(jax.random.PRNGKey(0), batch)
    assert set(trainable) == {"prompt"} and trainable["prompt"].shape == (4, BERT.d_model)
    before, plain = jit(lambda t, p: (model.apply(t, batch), base.apply(p, batch)),
                        trainable, params)
    assert before.shape == plain.shape == (32, 2)
    assert float(jnp.abs(before - plain).max()) > 1e-6            # the prompt changes outputs
    assert peft.optimizer_state_bytes(optax.adam(1e-2), trainable) == 2 * 4 * 4 * 32 + 4
    new, ls = train(model, trainable, batch, steps=30, lr=3e-2)
    assert ls[-1] < 0.2 * ls[0]
    assert float(jnp.abs(new["prompt"] - trainable["prompt"]).max()) > 0
    jax.tree.map(np.testing.assert_array_equal, model.base_params, frozen_copy)
    with pytest.raises(ValueError, match="train_modules"):
        peft.PromptTuningModel(base, 2, base_params=params, train_modules=("nope",))


def test_trainer_trains_a_lora_classifier_unchanged():
    """The wrappers honour the Model contract: `Trainer` builds the sharded state on the
    8-device mesh and trains LoRA factors + head; its state holds only those (the optimizer
    too), and the frozen base never moves."""
    from t2t.train import partitioning
    from t2t.train.trainer import TrainConfig, Trainer

    tokens, label = sentences(32, seed=6)
    batch = {k: np.asarray(v) for k, v in bert_batch(tokens, label=label).items()}
    base, params = classifier_params(batch)
    frozen_copy = jax.tree.map(np.copy, params)
    model = peft.LoraModel(base, rank=4, alpha=8.0, base_params=params,
                           train_modules=("classifier",))
    mesh = partitioning.make_mesh(partitioning.MeshConfig(8, 1, 1))
    trainer = Trainer(model, optax.adam(3e-2), mesh,
                      TrainConfig(model_dir="unused"))
    state = trainer.init_state(batch)
    losses = []
    for _ in range(30):
        state, metrics = trainer.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.3 * losses[0]
    new = jax.device_get(state.params)
    assert set(new) == {"lora", "modules"}
    assert peft.tree_bytes(state.opt_state) == 2 * peft.tree_bytes(new) + 4
    # Only the LoRA factors (and the head) moved; the base is bitwise unchanged.
    jax.tree.map(np.testing.assert_array_equal, model.base_params, frozen_copy)
    attn = new["lora"]["encoder"]["layers"]["layer_0"]["self_attention"]
    assert set(attn) == {"query", "value"} and float(np.abs(attn["query"]["lora_b"]).max()) > 0
    merged = model.merged_params(new)
    layer, base_layer = (t["encoder"]["layers"]["layer_0"] for t in (merged, params))
    assert float(np.abs(layer["self_attention"]["query"]["kernel"]
                        - base_layer["self_attention"]["query"]["kernel"]).max()) > 0
    jax.tree.map(np.testing.assert_array_equal, layer["self_attention"]["key"],
                 base_layer["self_attention"]["key"])
    jax.tree.map(np.testing.assert_array_equal, layer["mlp"], base_layer["mlp"])
