"""Sparse encoder attention (Longformer's band, BigBird's blocks) in the FLOP count: the
pairs really attended, by hand for tiny configs, and dense where the pattern covers all."""
import numpy as np
import pytest

from t2t.nn import block_sparse, longformer
from t2t.nn.config import TransformerConfig
from t2t.train import flops

# d=8, A = 2 heads x 4 = 8, F=16, plain MLP: q,k,v,o 256 + MLP 256 -> 2·512 a token-layer.
BASE = dict(vocab_size=100, d_model=8, num_heads=2, head_dim=4, d_ff=16,
            num_encoder_layers=2, mlp_activations=("gelu",), scan_layers=False,
            position_embedding="learned")
DENSE = TransformerConfig(**BASE)


def longformer_config(windows):
    return TransformerConfig(**BASE, attention_pattern="sliding_window",
                             attention_window=windows)


def bigbird_config(block_size, random_blocks):
    return TransformerConfig(**BASE, attention_pattern="block_sparse",
                             sparse_block_size=block_size, num_random_blocks=random_blocks)


def test_sliding_window_counts_each_layers_band_by_hand():
    """6 tokens; layer 0 window 2 (1 key a side): queries see 2,3,3,3,3,2 keys = 16; layer 1
    window 4 (2 a side): 3,4,5,5,4,3 = 24. Attention 4·A·(16 + 24); the rest as dense."""
    parts = flops.forward_flops_breakdown(longformer_config((2, 4)), "longformer",
                                          input_length=6, num_masked=2)
    dense = flops.forward_flops_breakdown(DENSE, "bert", input_length=6, num_masked=2)
    assert parts["attention"] == 4 * 8 * (16 + 24) == 1280
    assert dense["attention"] == 2 * 4 * 8 * 6 * 6 == 2304
    assert parts["dense"] == dense["dense"] == 2 * 6 * 2 * 512
    assert parts["logits"] == dense["logits"]


@pytest.mark.parametrize("length, window", [(1, 2), (7, 2), (9, 4), (16, 6), (33, 8),
                                            (10, 18), (10, 20)])
def test_sliding_window_pairs_equal_the_band_mask(length, window):
    i = np.arange(length)
    band = np.abs(i[:, None] - i[None, :]) <= window // 2
    assert longformer.scored_pairs(length, window) == int(band.sum())


@pytest.mark.parametrize("window", [10, 12, 4096])
def test_a_window_over_the_whole_input_counts_as_dense(window):
    """w/2 >= length - 1: every query attends every key."""
    got = flops.forward_flops_breakdown(longformer_config((window,)), "longformer",
                                        input_length=6)
    assert got == flops.forward_flops_breakdown(DENSE, "encoder", input_length=6)


def test_block_sparse_counts_the_blocks_by_hand():
    """Blocks of 2, 1 random block: 16 tokens are 8 blocks (over the 7-block dense limit);
    the 2 global query blocks score all 8 key blocks, the 6 middle ones 2 global + 3 window
    + 1 random = 6: 52 blocks of 2 x 2 pairs = 208 a head and layer (dense: 256). 17 tokens
    pad to 9 blocks: 2·9 + 7·6 = 60 blocks = 240 pairs."""
    cfg = bigbird_config(2, 1)
    assert block_sparse.scored_pairs(16, 2, 1) == 208
    assert block_sparse.scored_pairs(17, 2, 1) == 240
    parts = flops.forward_flops_breakdown(cfg, "bigbird", input_length=16, num_masked=3)
    dense = flops.forward_flops_breakdown(DENSE, "bert", input_length=16, num_masked=3)
    assert parts["attention"] == 2 * 4 * 8 * 208 == 13312
    assert dense["attention"] == 2 * 4 * 8 * 256
    assert parts["dense"] == dense["dense"] and parts["logits"] == dense["logits"]
    assert flops.step_flops(cfg, "bigbird", 4, input_length=16, num_masked=3) == \
        3 * 4 * sum(parts.values())


@pytest.mark.parametrize("length", [1, 9, 14])
def test_block_sparse_that_falls_back_to_dense_counts_as_dense(length):
    """At most (5 + 2r) blocks (14 tokens for blocks of 2, r=1) attend densely."""
    assert not block_sparse.use_block_sparse(length, 2, 1)
    got = flops.forward_flops_breakdown(bigbird_config(2, 1), "bigbird", input_length=length)
    assert got == flops.forward_flops_breakdown(DENSE, "encoder", input_length=length)


def test_base_models_at_4096_tokens_count_a_fraction_of_dense():
    """Longformer-base (window 512) and BigBird-base (blocks of 64, r=3) at 4,096 tokens:
    attention per layer and head 4096·513 - 256·257 and (2·64 + 62·8)·64² pairs, against
    4096², 8.2 and 6.6 times fewer: the attention FLOPs that dense counting overstated."""
    assert longformer.scored_pairs(4096, 512) == 4096 * 513 - 256 * 257
    assert block_sparse.scored_pairs(4096, 64, 3) == (2 * 64 + 62 * 8) * 64 * 64
    assert 4096 ** 2 / longformer.scored_pairs(4096, 512) == pytest.approx(8.3, abs=0.1)
    assert 4096 ** 2 / block_sparse.scored_pairs(4096, 64, 3) == pytest.approx(6.6, abs=0.1)
