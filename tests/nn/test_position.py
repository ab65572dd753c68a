import math

import jax.numpy as jnp
import numpy as np
import pytest

from t2t.errors import ConfigError
from t2t.nn.embed import Embedder
from t2t.nn.position import apply_rotary, relative_position_bucket, sinusoidal
from tests.nn.helpers import GPT_TINY, init, tokens


def reference_bucket(rel, bidirectional, num_buckets, max_distance):
    """T5 paper / mesh-tensorflow bucketing, written out scalar by scalar."""
    ret = 0
    n = -rel
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 20)])
def test_relative_bucket_matches_reference(bidirectional, num_buckets, max_distance):
    rel = np.arange(-300, 301)
    got = np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional, num_buckets,
                                              max_distance))
    want = [reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in rel]
    np.testing.assert_array_equal(got, want)
    assert got.min() >= 0 and got.max() == num_buckets - 1


def test_relative_bucket_known_values():
    # Bidirectional, 32 buckets: keys to the right go to buckets 16+.
    b = lambda r: int(relative_position_bucket(jnp.asarray(r), True, 32, 128))  # noqa: E731
    assert [b(0), b(-1), b(1), b(-7), b(7)] == [0, 1, 17, 7, 23]
    assert b(-1000) == 15 and b(1000) == 31
    # Causal: future keys all in bucket 0.
    c = lambda r: int(relative_position_bucket(jnp.asarray(r), False, 32, 128))  # noqa: E731
    assert [c(5), c(0), c(-3), c(-15), c(-16), c(-1000)] == [0, 0, 3, 15, 16, 31]


def test_sinusoidal_matches_vaswani():
    pe = np.asarray(sinusoidal(jnp.arange(50), 16))
    pos, i = 13, 3
    assert pe[pos, 2 * i] == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-5)
    assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)), abs=1e-5)


def test_rotary_is_relative():
    """q·k after RoPE depends only on the distance between their positions."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(1, 1, 1, 8)), jnp.float32)
    def score(pq, pk):
        rq = apply_rotary(q, jnp.array([[pq]]))
        rk = apply_rotary(k, jnp.array([[pk]]))
        return float(jnp.sum(rq * rk))
    assert score(3, 1) == pytest.approx(score(10, 8), abs=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), abs=1e-3)
    # Norm preserved (a rotation).
    assert float(jnp.linalg.norm(apply_rotary(q, jnp.array([[7]])))) == pytest.approx(
        float(jnp.linalg.norm(q)), rel=1e-6)


def test_a_sequence_longer_than_the_learned_table_is_a_config_error():
    """Past max_length the lookup would read NaN (JAX fills out-of-range gathers), and the
    run would stop at its first step with a NaN loss: say what to change instead."""
    cfg = GPT_TINY.replace(max_length=8)
    embedder = Embedder(cfg)
    positions = jnp.arange(8)[None]
    params = init(embedder, tokens(0, (1, 8)), positions)
    assert np.isfinite(np.asarray(embedder.apply({"params": params}, tokens(1, (1, 8)),
                                                 positions))).all()
    with pytest.raises(ConfigError, match="max_length = 8 rows"):
        embedder.apply({"params": params}, tokens(1, (1, 9)), jnp.arange(9)[None])
    offset = Embedder(cfg.replace(position_offset=2))      # BART, RoBERTa: from position 2
    with pytest.raises(ConfigError, match="7 tokens from position 2"):
        offset.apply({"params": params}, tokens(1, (1, 7)), 2 + jnp.arange(7)[None])
