"""FLOPs of the Weighted and Evolved Transformer layers (t2t/nn/weighted.py, evolved.py) and
of Narang et al.'s separable convolutions, counted by hand on the tiny encoder-decoder of
test_flops_part_b (d = 32, A = 4 x 8, gated d_ff = 48, S = 7, T = 6, 2 + 2 layers)."""
from tests.train.test_flops_part_b import A, D, S, T, _delta

FFN = 3 * 2 * D * 48                 # wi_0, wi_1, wo: one pass through the gated FFN


def test_weighted_layers_run_the_ffn_once_per_head_branch():
    # encoder: 4 branches instead of 1 FFN; decoder: 4 + 4 branches instead of 1
    assert _delta(layer_type="weighted") == {
        "dense": 2 * S * 3 * FFN + 2 * T * 7 * FFN, "attention": 0, "logits": 0}


def test_evolved_cells_add_their_convolutions_and_branches():
    encoder = 2 * 32 * 64 + 2 * 32 * 128 + 2 * 3 * 32 * 16 + 2 * 9 * 128 + 2 * 128 * 16
    wide = 2 * 4 * 32 * 64                                       # 8-head q, k, v, o
    convs = (2 * 11 * 32 + 2 * 32 * 64) + (2 * 7 * 32 + 2 * 32 * 16) + (2 * 7 * 64 + 2 * 64 * 32)
    swish = -2 * D * 48                                          # one wi instead of two
    cross = 2 * 2 * D * A * (T + S)                              # the branch's q, o and k, v
    delta = _delta(layer_type="evolved")
    assert delta["dense"] == 2 * S * encoder + 2 * (T * (wide + convs + swish) + cross)
    assert delta["attention"] == 2 * (4 * T * T * 2 * A * 0.5 + 4 * T * S * A)


def test_separable_per_channel_convolutions_add_the_pointwise_map_and_channel_kernels():
    per_token = 2 * 32 * 64 + 2 * 32 * 32 - 2 * 4 * 32 * 32 + 2 * 32 * 3 + 2 * 32 * 32
    delta = _delta(convolution="dynamic", conv_kernel_size=3, conv_groups=32,
                   conv_pointwise=True)
    assert delta["dense"] == 2 * (S + T) * (per_token + 2 * 32 * 32 * 3)   # kernels d -> d k
