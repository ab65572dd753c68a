"""ReZero (Bachlechner et al. 2020) and Fixup (Zhang et al. 2019) residual branches."""
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn import Encoder, EncoderDecoder
from t2t.nn.blocks import TransformerLayer
from t2t.nn.residual import fixup_num_branches, fixup_scale

from tests.nn.helpers import T5_TINY, init, max_diff, tokens


def _layer_io(cfg, seed=0):
    layer = TransformerLayer(cfg)
    x = jax.random.normal(jax.random.PRNGKey(seed), (2, 7, cfg.d_model))
    enc = jax.random.normal(jax.random.PRNGKey(seed + 1), (2, 5, cfg.d_model))
    return layer, x, enc, init(layer, x, enc)


@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
def test_rezero_layer_is_the_identity_at_init(norm):
    """alpha = 0 for every sub-block: the layer (self-, cross-attention, FFN) maps x to x."""
    cfg = T5_TINY.replace(residual_scaling="rezero", norm_type=norm)
    layer, x, enc, params = _layer_io(cfg)
    for gate in ("self_attention_gate", "cross_attention_gate", "mlp_gate"):
        assert params[gate] == {"alpha": 0.0}
    assert max_diff(layer.apply({"params": params}, x, enc), x) == 0.0
    assert ("self_attention_norm" in params) == (norm != "none")   # "none" has no params


def test_rezero_is_x_plus_alpha_times_the_branch():
    """With alpha = 1 and a LayerNorm, ReZero is the plain pre-LN layer; with alpha = a the
    FFN-only difference is a * F(x) (checked through one layer without attention change)."""
    plain = T5_TINY.replace(norm_type="layer")
    layer, x, enc, params = _layer_io(plain)
    rz_layer = TransformerLayer(plain.replace(residual_scaling="rezero"))
    rz_params = {**params, **{g: {"alpha": jnp.asarray(1.0)} for g in
                              ("self_attention_gate", "cross_attention_gate", "mlp_gate")}}
    want = layer.apply({"params": params}, x, enc)
    assert max_diff(rz_layer.apply({"params": rz_params}, x, enc), want) < 1e-6
    # alpha = 0.3 on the FFN only: output = h + 0.3 FFN(LN(h)) with h after the attentions
    a = 0.3
    rz_params = {**rz_params, "mlp_gate": {"alpha": jnp.asarray(a)}}
    got = rz_layer.apply({"params": rz_params}, x, enc)
    no_ffn = {**rz_params, "mlp_gate": {"alpha": jnp.asarray(0.0)}}
    h = rz_layer.apply({"params": no_ffn}, x, enc)
    ffn = rz_layer.apply({"params": rz_params}, h, method=lambda m, h: m.mlp(m.mlp_norm(h)))
    assert max_diff(got, h + a * ffn) < 1e-5


def test_rezero_alpha_gets_a_gradient_at_init():
    cfg = T5_TINY.replace(residual_scaling="rezero", norm_type="none")
    layer, x, enc, params = _layer_io(cfg)
    grads = jax.jit(jax.grad(lambda p: jnp.sum(layer.apply({"params": p}, x, enc) ** 2)))(params)
    assert all(abs(float(grads[g]["alpha"])) > 0 for g in
               ("self_attention_gate", "cross_attention_gate", "mlp_gate"))


def test_fixup_initialisation_follows_the_papers_rules():
    """Rule 1: each branch's last layer (attention `out`, FFN `wo`) is 0. Rule 2: the other
    weight layers have the standard init's std times L^(-1/(2m-2)), m = 2, L = 2 per
    encoder layer + 3 per decoder layer. Rule 3: scalar multipliers 1, scalar biases 0."""
    cfg = T5_TINY.replace(residual_scaling="fixup", norm_type="none", d_model=256,
                          num_heads=4, head_dim=64, d_ff=1024, num_encoder_layers=3,
                          num_decoder_layers=2)
    assert fixup_num_branches(cfg) == 2 * 3 + 3 * 2
    assert fixup_scale(cfg) == pytest.approx(12 ** -0.5)
    model = EncoderDecoder(cfg)
    params = init(model, tokens(1, (2, 8)), tokens(2, (2, 4)))
    flat = flax.traverse_util.flatten_dict(params, sep="/")
    base_std = 256 ** -0.5           # fan-in variance scaling of q/k/v/wi (d_model inputs)
    checked = {"zero": 0, "scaled": 0, "scalar": 0}
    for path, value in flat.items():
        value = np.asarray(value)
        if path.endswith(("out/kernel", "wo/kernel")) and "layers" in path:
            assert not value.any(), path
            checked["zero"] += 1
        elif path.endswith(("query/kernel", "key/kernel", "value/kernel", "wi_0/kernel",
                            "wi_1/kernel")) and "layers" in path:
            assert value.std() == pytest.approx(base_std * 12 ** -0.5, rel=0.05), path
            checked["scaled"] += 1
        elif "fixup_bias" in path or path.endswith(("bias_in", "bias_out")):
            assert value == 0.0, path
            checked["scalar"] += 1
        elif path.endswith("/scale") and "gate" in path:
            assert value == 1.0, path
            checked["scalar"] += 1
    # 3 encoder layers x 2 branches + 2 decoder layers x 3 branches; q, k, v, wi_0, wi_1
    assert checked["zero"] == 12 and checked["scaled"] == 3 * 5 + 2 * 8
    assert checked["scalar"] == 12 * 3 + 5 * 3 + 7   # 3 per gate; 3 per FFN, 1 per attention
    assert not any("norm" in p for p in flat)                         # no normalisation


def test_fixup_encoder_is_the_identity_on_its_embeddings_at_init():
    cfg = T5_TINY.replace(residual_scaling="fixup", norm_type="none", position_embedding="none")
    enc = Encoder(cfg)
    toks = tokens(3, (2, 6))
    params = init(enc, toks)
    table = params["token_embedder"]["embedding"] if "token_embedder" in params else \
        params["embedder"]["token_embedder"]["embedding"]
    assert max_diff(enc.apply({"params": params}, toks), table[toks]) < 1e-6


def test_bad_residual_options_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="residual_scaling='resnet'"):
        T5_TINY.replace(residual_scaling="resnet")
    with pytest.raises(ConfigError, match="set norm_type='none'"):
        T5_TINY.replace(residual_scaling="fixup")
    with pytest.raises(ConfigError, match="norm_type='batch'"):
        T5_TINY.replace(norm_type="batch")
