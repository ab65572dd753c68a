"""ELMo-style probing: every layer collected (loop and scan), the scalar mix, frozen
features (no gradient reaches the encoder), per-layer probes find the informative layer."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.models import peft, probing
from t2t.models.classifiers import BertTrunk

from tests.models.test_classifiers import (BERT, bert_batch, bert_trunk, finetune_init, jit,
                                           sentences)


def test_collect_layers_loop_and_scan_match_the_encoder():
    tokens, _ = sentences(64, seed=8)
    labels = np.arange(64) % 2
    tokens[:, 1] = np.where(labels == 1, 20, 30)
    seg = np.ones_like(tokens)
    seg[1, -3:] = 0
    for cfg in (BERT, BERT.replace(scan_layers=True)):
        def run(p):
            layers = probing.bert_layers(cfg, p, tokens, seg)  # noqa: B023
            last = BertTrunk(cfg).apply({"params": p}, tokens, seg, method="encode")  # noqa: B023
            return layers, last

        layers, last = jit(run, bert_trunk(cfg))
        assert layers.shape == (cfg.num_encoder_layers + 1, 64, 8, cfg.d_model)
        np.testing.assert_array_equal(layers[-1], last)        # post-LN: last = output
        # Layer 0 is the embedding output (LayerNorm'd: zero mean per token).
        np.testing.assert_allclose(np.asarray(layers[0]).mean(-1), 0.0, atol=1e-5)
        assert not np.allclose(layers[0], layers[1]) and not np.allclose(layers[1], layers[2])
    # Real behaviour: the embeddings (layer 0) at position 1 tell which of two tokens sits
    # there, so a probe on them must be perfect.
    acc = probing.probe_layers(layers[:, :, 1], labels, 2, steps=100)
    assert acc.shape == (3,) and acc[0] == 1.0


def test_scalar_mix_is_a_softmax_weighted_scaled_sum():
    layers = np.random.default_rng(0).standard_normal((3, 2, 4, 5)).astype(np.float32)
    mix = probing.ScalarMix(3)
    params = {"weights": jnp.array([1.0, -2.0, 0.5]), "gamma": jnp.array(2.0)}

    def run(x, p):
        fresh = mix.init(jax.random.PRNGKey(0), x)["params"]
        return (mix.apply({"params": fresh}, x), mix.apply({"params": p}, x),
                probing.mix_weights({"scalar_mix": p}))

    at_init, mixed, weights = jit(run, layers, params)
    np.testing.assert_allclose(at_init, layers.mean(0), rtol=1e-5, atol=1e-6)  # w=0, γ=1
    s = np.exp([1.0, -2.0, 0.5]) / np.exp([1.0, -2.0, 0.5]).sum()
    np.testing.assert_allclose(weights, s, rtol=1e-5)
    np.testing.assert_allclose(float(weights.sum()), 1.0, rtol=1e-6)
    np.testing.assert_allclose(mixed, 2.0 * np.tensordot(s, layers, 1), rtol=1e-5, atol=1e-6)


def test_scalar_mix_classifier_trains_the_mix_on_frozen_features():
    tokens, label = sentences(32, seed=9)
    batch = bert_batch(tokens, label=label)
    model = probing.ScalarMixClassifier(BERT, 2, pooling="mean")
    params = finetune_init(model, batch, seed=9)
    assert set(params) == {"token_embedder", "encoder", "scalar_mix", "classifier"}
    # With the trunk frozen in the optimizer too: no state for it, and it never moves.
    tx = peft.freeze(optax.adam(3e-2), ("token_embedder", "encoder"))
    head = {k: params[k] for k in ("scalar_mix", "classifier")}
    assert peft.optimizer_state_bytes(tx, params) == 2 * peft.tree_bytes(head) + 4

    def fit(p):
        def step(carry, _):
            p, s = carry
            (loss, _), g = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch)
            u, s = tx.update(g, s, p)
            return (optax.apply_updates(p, u), s), loss
        grads = jax.grad(lambda q: model.loss_fn(q, batch)[0])(p)
        return jax.lax.scan(step, (p, tx.init(p)), None, length=40), grads

    ((new, _), ls), grads = jit(fit, params)
    for name in ("token_embedder", "encoder"):                # stop_gradient: exactly zero
        assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads[name])), name
    assert float(jnp.abs(grads["scalar_mix"]["weights"]).max()) > 0
    assert float(jnp.abs(grads["classifier"]["dense"]["kernel"]).max()) > 0
    assert ls[-1] < 0.2 * ls[0]
    jax.tree.map(np.testing.assert_array_equal, new["encoder"], params["encoder"])
    w = probing.mix_weights(new)
    assert w.shape == (BERT.num_encoder_layers + 1,)
    np.testing.assert_allclose(float(w.sum()), 1.0, rtol=1e-6)
    assert float(jnp.abs(w - 1 / 3).max()) > 1e-4            # the mix moved off uniform


def test_probe_finds_the_layer_that_carries_the_signal():
    """Hand-set features: 5 layers of Gaussian noise; only layer 3 has the label in one
    dimension (+-2.5: Bayes accuracy 0.994). Held-out accuracy is ~1 at layer 3, ~chance
    elsewhere."""
    rng = np.random.default_rng(0)
    n, d, k = 400, 8, 3
    labels = rng.integers(0, 2, n)
    feats = rng.standard_normal((5, n, d)).astype(np.float32)
    feats[k, :, 2] += 2.5 * (2 * labels - 1)
    acc = probing.probe_layers(feats[:, :300], labels[:300], 2, eval_features=feats[:, 300:],
                               eval_labels=labels[300:], steps=150)
    assert acc.shape == (5,) and int(np.argmax(acc)) == k
    assert acc[k] > 0.95 and np.delete(acc, k).max() < 0.7
