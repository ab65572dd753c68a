"""FLOPs of Narang et al. 2021's part B options, counted by hand on a tiny encoder-decoder
(d = 32, A = 4 x 8, d_ff = 48 gated, vocabulary 64, 2 + 2 layers, S = 7, T = 6)."""
from t2t.train.flops import forward_flops_breakdown

from tests.nn.helpers import T5_TINY

S, T, D, A = 7, 6, 32, 32
PER_TOKEN_LAYER = 2 * (4 * D * A + 3 * D * 48)


def _delta(**changes):
    plain = forward_flops_breakdown(T5_TINY, "t5", input_length=S, target_length=T)
    other = forward_flops_breakdown(T5_TINY.replace(**changes), "t5", input_length=S,
                                    target_length=T)
    return {k: other[k] - plain[k] for k in plain}


def test_convolutions_replace_projections_and_attention_products():
    per_token = 2 * 32 * 64 + 2 * 32 * 32 - 2 * 4 * 32 * 32 + 2 * 32 * 3   # GLU, out, taps
    attention = -(2 * 4 * S * S * A + 2 * 4 * T * T * A * 0.5)              # causal decoder
    light = _delta(convolution="lightweight", conv_kernel_size=3)
    assert light == {"dense": 2 * (S + T) * per_token, "attention": attention, "logits": 0}
    dynamic = _delta(convolution="dynamic", conv_kernel_size=3)
    assert dynamic["dense"] == 2 * (S + T) * (per_token + 2 * 32 * 4 * 3)   # kernels d -> H k


def test_adaptive_softmax_and_mixture_logits_per_position():
    # head 32 -> 10 + 2 clusters; tails 32 -> 8 -> 20 and 32 -> 2 -> 34 (widths d / 4^i)
    untied = 2 * 32 * 12 + (2 * 32 * 8 + 2 * 8 * 20) + (2 * 32 * 2 + 2 * 2 * 34)
    delta = _delta(output_layer="adaptive_softmax", adaptive_cutoffs=(10, 30),
                   tie_embeddings=False)
    assert delta["logits"] == T * untied - T * 2 * 32 * 64
    no_projection = 2 * 32 * 12 + 2 * 32 * 20 + 2 * 32 * 34
    delta = _delta(output_layer="adaptive_softmax", adaptive_cutoffs=(10, 30),
                   tie_embeddings=False, adaptive_softmax_projection=False)
    assert delta["logits"] == T * no_projection - T * 2 * 32 * 64
    tied = _delta(output_layer="adaptive_softmax", adaptive_cutoffs=(10, 30),
                  adaptive_input=True)   # head projection too; inputs through 3 projections
    assert tied["logits"] == T * (2 * 32 * 32 + untied) - T * 2 * 32 * 64
    assert tied["dense"] == (S + T) * 2 * 32 * (32 + 8 + 2)
    mos = _delta(output_layer="mixture_of_softmaxes", mos_num_softmaxes=3)
    assert mos["logits"] == T * (2 * 32 * 3 + 2 * 32 * 3 * 32 + 3 * 2 * 32 * 64) - T * 2 * 32 * 64


def test_product_key_memory_funnel_and_transparent_mix():
    memory = 2 * 32 * 2 * 8 + 2 * 2 * 6 * 8 + 2 * 2 * 3 * 32    # query, sub-keys, values
    pkm = _delta(pkm_layers=(1,), pkm_num_keys=6, pkm_key_dim=8, pkm_heads=2, pkm_topk=3)
    assert pkm == {"dense": T * (memory - 3 * 2 * 32 * 48), "attention": 0, "logits": 0}
    # funnel (1, 1): layer 0 on 7 tokens; layer 1 pools to 4 queries reading 7 keys/values;
    # the decoder's cross-attention reads 4 states instead of 7
    funnel = _delta(funnel_blocks=(1, 1))
    kv = 2 * 2 * D * A
    assert funnel["dense"] == (4 - 7) * PER_TOKEN_LAYER + kv * (7 - 4) + 2 * kv * (4 - 7)
    assert funnel["attention"] == 4 * 4 * 7 * A - 4 * 7 * 7 * A + 2 * 4 * T * (4 - 7) * A
    transparent = _delta(transparent_attention=True)
    assert transparent["dense"] == 2 * 3 * 2 * S * D       # (N + 1) x M weights, S x d
