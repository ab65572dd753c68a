"""Universal Transformer (Dehghani et al. 2019): recurrence, coordinate embedding, ACT."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import Decoder, EncoderDecoder
from t2t.nn.blocks import TransformerLayer
from t2t.nn.universal import PONDER_COLLECTION, UniversalStack, coordinate_signal, ponder_loss

from tests.nn.helpers import T5_TINY, init, max_diff, tokens
from tests.nn.test_stacks import decode_stepwise

CFG = T5_TINY.replace(universal_steps=4, position_embedding="none")


def _signal(positions, t, d):
    """Sec. 2.1's P^t[i, 2j] = sin(i/10000^(2j/d)) + sin(t/10000^(2j/d)), cos at 2j+1."""
    out = np.zeros(positions.shape + (d,))
    for j in range(0, d, 2):
        w = 10000.0 ** (j / d)
        out[..., j] = np.sin(positions / w) + np.sin(t / w)
        out[..., j + 1] = np.cos(positions / w) + np.cos(t / w)
    return out


def test_coordinate_signal_is_the_papers_equation():
    pos = np.array([[0, 1, 2, 7]])
    assert max_diff(coordinate_signal(jnp.asarray(pos), 3, 16), _signal(pos, 3, 16)) < 1e-5


def _transformed_states(cfg, params, x, pos):
    """The plain recurrence s_t = layer(s_{t-1} + P^t), t = 1..T: (inputs, outputs)."""
    layer = TransformerLayer(cfg)
    inputs, outputs, s = [], [], x
    for t in range(1, cfg.universal_steps + 1):
        s = s + jnp.asarray(_signal(np.asarray(pos), t, cfg.d_model), jnp.float32)
        inputs.append(s)
        s = layer.apply({"params": params["step"]["layer"]}, s)
        outputs.append(s)
    return inputs, outputs


def test_without_act_it_is_t_applications_of_one_shared_layer():
    stack = UniversalStack(CFG)
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, CFG.d_model))
    params = init(stack, x)
    assert set(params) == {"step"} and set(params["step"]) == {"layer"}   # one shared layer
    pos = jnp.broadcast_to(jnp.arange(5), (2, 5))
    _, outputs = _transformed_states(CFG, params, x, pos)
    assert max_diff(stack.apply({"params": params}, x), outputs[-1]) < 1e-5


def _act_reference(cfg, params, x, pos):
    """Graves' ACT as the authors' reference computes it, in numpy (float64)."""
    inputs, outputs = _transformed_states(cfg, params, x, pos)
    w = np.asarray(params["step"]["halting"]["kernel"], np.float64)[:, 0]
    b = float(params["step"]["halting"]["bias"][0])
    shape = x.shape[:2]
    halting, remainders, n, out = np.zeros(shape), np.zeros(shape), np.zeros(shape), 0.0
    halted = np.zeros(shape, bool)
    for s_in, s_out in zip(inputs, outputs):
        p = 1 / (1 + np.exp(-(np.asarray(s_in, np.float64) @ w + b)))
        running = ~halted
        stop = running & (halting + p > cfg.universal_act_threshold)
        go = running & ~stop
        halting = halting + p * go
        remainders = remainders + stop * (1 - halting)
        weight = p * go + stop * (1 - halting)
        n = n + go + stop
        halted |= stop
        out = out + weight[..., None] * np.asarray(s_out, np.float64)
    return out, n, remainders


def test_act_halts_after_the_threshold_and_mixes_the_steps():
    cfg = CFG.replace(universal_act=True, universal_steps=5)
    stack = UniversalStack(cfg)
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 6, cfg.d_model))
    params = init(stack, x)
    pos = jnp.broadcast_to(jnp.arange(6), (2, 6))
    # constructed: p = sigmoid(-0.405) = 0.4 everywhere -> 0.4, 0.8, then 1.2 > 0.99 halts at
    # step 3 with remainder 0.2; steps 4 and 5 leave the output alone.
    halting = {"kernel": jnp.zeros_like(params["step"]["halting"]["kernel"]),
               "bias": jnp.asarray([np.log(0.4 / 0.6)], jnp.float32)}
    fixed = {"step": {**params["step"], "halting": halting}}
    out, sown = stack.apply({"params": fixed}, x, mutable=[PONDER_COLLECTION])
    _, outputs = _transformed_states(cfg, fixed, x, pos)
    want = 0.4 * outputs[0] + 0.4 * outputs[1] + 0.2 * outputs[2]
    assert max_diff(out, want) < 1e-5
    assert float(sown[PONDER_COLLECTION]["ponder_cost"][0]) == pytest.approx(3.2, abs=1e-5)
    # learned halting unit: positions halt at different steps, as the reference says
    params["step"]["halting"]["kernel"] = 0.5 * params["step"]["halting"]["kernel"]
    want, n, remainders = _act_reference(cfg, params, x, pos)
    out, sown = stack.apply({"params": params}, x, mutable=[PONDER_COLLECTION])
    assert max_diff(out, want) < 1e-4
    assert len(np.unique(n)) > 1, "the constructed input should halt positions differently"
    cost = float(sown[PONDER_COLLECTION]["ponder_cost"][0])
    assert cost == pytest.approx(float(np.mean(n + remainders)), abs=1e-4)


def test_ponder_loss_sums_the_stacks_and_decoding_matches_the_full_pass():
    cfg = CFG.replace(universal_act=True, universal_ponder_weight=0.5)
    model = EncoderDecoder(cfg)
    enc, dec = tokens(1, (2, 7)), tokens(2, (2, 5))
    params = init(model, enc, dec)
    _, sown = model.apply({"params": params}, enc, dec, mutable=[PONDER_COLLECTION])
    loss, metrics = ponder_loss(cfg, sown[PONDER_COLLECTION])
    costs = jax.tree.leaves(sown[PONDER_COLLECTION])
    assert len(costs) == 4                       # encoder and decoder: cost and steps each
    assert float(loss) == pytest.approx(0.5 * float(metrics["ponder_cost"]))
    assert float(metrics["ponder_cost"]) >= 2.0  # at least one step per stack
    dec_only = Decoder(cfg)
    toks = tokens(3, (2, 6))
    p = init(dec_only, toks)
    assert max_diff(decode_stepwise(dec_only, p, toks), dec_only.apply({"params": p}, toks)) < 1e-4


def test_bad_universal_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="universal_act_threshold"):
        CFG.replace(universal_act_threshold=1.5)
    with pytest.raises(ConfigError, match="scan_layers=False"):
        CFG.replace(scan_layers=True)


def test_flops_count_each_step_as_a_layer():
    from t2t.train.flops import forward_flops_breakdown
    lengths = dict(input_length=8, target_length=4)
    unrolled = CFG.replace(universal_steps=0, num_encoder_layers=4, num_decoder_layers=4)
    assert (forward_flops_breakdown(CFG, "t5", **lengths)
            == forward_flops_breakdown(unrolled, "t5", **lengths))
