"""Tiny configs and init helpers shared by the nn tests."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from t2t.nn.config import TransformerConfig
from t2t.nn.stacks import EncoderDecoder

T5_TINY = TransformerConfig(vocab_size=64, d_model=32, num_heads=4, head_dim=8, d_ff=48,
                            num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0)
BERT_TINY = T5_TINY.replace(norm_type="layer", norm_eps=1e-12, pre_norm=False, use_bias=True,
                            position_embedding="learned", max_length=64, type_vocab_size=2,
                            embedding_norm=True, mlp_activations=("gelu",), kernel_init="normal",
                            num_decoder_layers=0)
GPT_TINY = BERT_TINY.replace(pre_norm=True, norm_eps=1e-5, mlp_activations=("gelu_tanh",),
                             type_vocab_size=0, embedding_norm=False, num_encoder_layers=0,
                             num_decoder_layers=2)


def tokens(key, shape, vocab=64, low=1):
    return jax.random.randint(jax.random.PRNGKey(key), shape, low, vocab)


def init(module, *args, **kwargs):
    return nn.unbox(module.init(jax.random.PRNGKey(0), *args, **kwargs)["params"])


def max_diff(a, b):
    """max |a - b| in float32, on the host (an eager op would compile a program per shape)."""
    a, b = (np.asarray(x).astype(np.float32) for x in (a, b))
    return float(np.max(np.abs(a - b)))


def decode_encoder_decoder_stepwise(model, params, enc, dec, enc_seg=None):
    """Encode once, then feed `dec` [b, l] one token at a time through the KV cache (sized
    from zeroed inputs and another key: only its shapes may matter) -> logits [b, l, vocab]."""
    encoded = model.apply({"params": params}, enc, enc_seg, method=EncoderDecoder.encode)
    cache = jax.jit(lambda: model.init(jax.random.PRNGKey(7), jnp.zeros_like(enc), dec, enc_seg,
                                       decode=True)["cache"])()
    return feed_one_token_at_a_time(lambda cache, token: model.apply(
        {"params": params, "cache": cache}, encoded, token, enc_seg, decode=True,
        mutable=["cache"], method=EncoderDecoder.decode), cache, dec)


def feed_one_token_at_a_time(step, cache, toks):
    """`step(cache, token [b, 1]) -> (logits [b, 1, vocab], {"cache": ...})`, jitted once and
    called for each position of `toks` [b, l] in turn -> logits [b, l, vocab]."""
    step = jax.jit(step)
    outs = []
    for i in range(toks.shape[1]):
        out, state = step(cache, toks[:, i:i + 1])
        cache = state["cache"]
        outs.append(out)
    return jnp.concatenate(outs, 1)
