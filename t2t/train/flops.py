"""One FLOP count for every family, and model FLOPs utilisation (MFU).

Counted are matrix multiplies only (a multiply-add is 2 FLOPs); norms, softmax, activations
and embedding lookups are ignored, as in the PaLM paper (appendix B) and MaxText. Training
costs 3× the forward pass (the backward pass needs two matmuls per forward matmul: one for
the input gradient, one for the weight gradient). Rematerialisation is *not* counted — this
is model FLOPs, not hardware FLOPs.

Notation (all from :class:`~t2t.nn.config.TransformerConfig`): ``d = d_model``,
``A = num_heads * head_dim``, ``F = d_ff``, ``g = len(mlp_activations)`` (2 for gated
MLPs), ``V = vocab_size``, ``E = embedding_dim`` (ALBERT, else none), ``S`` input
(encoder) length, ``T`` target (decoder) length, ``P`` positions that get logits.

Forward FLOPs of one example:

* dense, per token and layer: ``2 · (4·d·A + (g+1)·d·F)`` — q, k, v, o and the MLP.
  Summed over tokens this is the familiar ``2·N`` (``6·N`` for training) with ``N`` the
  matmul parameters a token passes through.
* self-attention, per layer: ``4 · Lq · Lk · A`` (``QKᵀ`` and ``A·V``, 2·Lq·Lk·A each);
  halved when causal (only the lower triangle is needed). Encoder: ``Lq = Lk = S``;
  decoder: ``Lq = Lk = T``. Sparse encoder patterns count the pairs they attend instead
  of ``S²`` (`encoder_scored_pairs`): Longformer's band of ``w + 1`` keys a query (cut at
  the ends; its global tokens, which depend on the batch and which MLM pretraining has
  none of, are not counted), BigBird's blocks (``S²`` where it falls back to dense).
* cross-attention (encoder-decoder), per decoder layer: ``2·2·d·A·T`` (q, o on decoder
  tokens) + ``2·2·d·A·S`` (k, v on encoder outputs) + ``4·T·S·A`` (never causal).
* logits: ``2 · d_out · V · P`` with ``d_out = E or d``; ``P`` = ``T`` for decoders, the number
  of masked positions for MLM when given (BERT computes logits only there), else ``S``.
  ALBERT adds ``2·E·d`` per input token (embedding projection) and ``2·d·E`` per logit
  position (head projection).

Task heads other than the vocab projection (BERT's MLM transform, pooler, NSP) are left out;
they are below 0.2% of BERT-base's step. Tokens per example, for per-token numbers: ``S``
(encoder), ``T`` (decoder), ``S + T`` (encoder-decoder).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import jax
import numpy as np

from t2t.models import families
from t2t.nn import block_sparse, longformer
from t2t.nn.adaptive_softmax import cluster_bounds, cluster_widths
from t2t.nn.config import TransformerConfig

# The Transformer formulas by the stacks they count; any other name is a model family's
# (t2t.models.families: each family names its formula).
FORMULAS = {"encoder": families.ENCODER, "decoder": families.DECODER,
            "encoder_decoder": families.ENCODER_DECODER}


def formula(family: str) -> families.FlopFormula:
    """The FLOP formula of a family (or of "encoder", "decoder", "encoder_decoder")."""
    if family in FORMULAS:
        return FORMULAS[family]
    try:
        return families.get(family).flops
    except ValueError:
        raise ValueError(f"unknown family {family!r}; choose one of "
                         f"{sorted(FORMULAS) + families.names()}") from None


def _lengths(family: str, counted: families.FlopFormula, input_length: Optional[int],
             target_length: Optional[int]) -> tuple[int, int]:
    need = [n for n, on in (("input_length", counted.encoder),
                            ("target_length", counted.decoder)) if on]
    given = {"input_length": input_length, "target_length": target_length}
    missing = [n for n in need if not given[n]]
    if missing:
        raise ValueError(f"family {family!r} needs {' and '.join(need)}; missing {missing}")
    return int(input_length or 0), int(target_length or 0)


def encoder_scored_pairs(config: TransformerConfig, s: int, layers: int) -> int:
    """(query, key) pairs one head scores over `layers` encoder layers of `s` tokens:
    ``s²`` a layer for dense attention; Longformer's band (`attention_pattern`
    "sliding_window", each layer's window: `t2t.nn.longformer.scored_pairs`, the paper's
    count, global tokens not counted); BigBird's blocks ("block_sparse":
    `t2t.nn.block_sparse.scored_pairs`, ``s²`` where it falls back to dense)."""
    if config.attention_pattern == "sliding_window":
        return sum(longformer.scored_pairs(s, longformer.layer_window(config, i))
                   for i in range(layers))
    if config.attention_pattern == "block_sparse":
        return layers * block_sparse.scored_pairs(s, config.sparse_block_size,
                                                  config.num_random_blocks)
    return layers * s * s


def _synthesizer_delta(config: TransformerConfig, n: int, causal_factor: float
                        ) -> tuple[float, float]:
    """(dense, attention) FLOPs a synthesizer self-attention (t2t/nn/synthesizer.py) adds to
    one dot-product self-attention layer over n tokens (negative where it saves): the plain
    variants drop the query/key projections (2 x 2·d·a per token) and q·kᵀ (2·n²·a); dense
    adds W1 (2·d·a per token) and W2 (2·a·n per token), factorized R1·R2ᵀ (2·n²·k·heads)."""
    kind = config.synthesizer
    if kind == "none":
        return 0.0, 0.0
    d, a = config.d_model, config.num_heads * config.head_dim
    dense = attention = 0.0
    if "_plus" not in kind:
        dense -= 2 * 2 * d * a * n
        attention -= 2 * n * n * a * causal_factor
    if kind.startswith("dense"):
        dense += 2 * d * a * n
        attention += 2 * a * n * n * causal_factor
    elif kind.startswith("factorized"):
        attention += 2 * n * n * config.synthesizer_rank * config.num_heads * causal_factor
    return dense, attention


def _output_layer_logits(config: TransformerConfig) -> float:
    """Logit FLOPs per position of the adaptive softmax (every cluster computed, as
    t2t/nn/adaptive_softmax.py does; its projections included) or the mixture of softmaxes
    (prior 2·d·K, contexts 2·d·K·d, K softmax layers); None for the plain softmax."""
    d, e, v = config.d_model, config.embedding_dim, config.vocab_size
    plain = 2 * (e or d) * v + (2 * d * e if e else 0)
    if config.output_layer == "mixture_of_softmaxes":
        k = config.mos_num_softmaxes
        return 2 * d * k + 2 * d * k * d + k * plain
    bounds, widths = cluster_bounds(v, config.adaptive_cutoffs), cluster_widths(config)
    project = config.adaptive_softmax_projection
    tied_head = config.tie_embeddings and project          # the head's own projection
    total = (2 * d * widths[0] if tied_head else 0) + 2 * widths[0] * (bounds[1] + len(bounds) - 2)
    for i in range(1, len(bounds) - 1):
        total += (2 * d * widths[i] if project else 0) + 2 * widths[i] * (bounds[i + 1] - bounds[i])
    return total


def _part_b_delta(config: TransformerConfig, enc: bool, dec: bool, s: int, t: int,
                  n_enc: int, n_dec: int, causal_factor: float, per_token_layer: float
                  ) -> tuple[float, float]:
    """(dense, attention) FLOPs that Narang et al. 2021's part B options add to the plain
    count of one example (negative where they save):

    * convolutions (t2t/nn/lightweight_conv.py) in place of self-attention: GLU input
      2·d·2d and output 2·d·d per token (the pointwise map another 2·d·d), the depthwise taps
      2·d·k and the dynamic kernels 2·d·H·k, against q, k, v, o (2·4·d·A) and the attention
      products;
    * the funnel (t2t/nn/funnel.py): block i runs on ceil(S / 2^i) tokens, its first layer
      attending to the previous block's length; the decoder's cross-attention reads the
      pooled memory;
    * product-key memory in decoder layers `pkm_layers`: the query 2·d·H·d_k, sub-key
      scores 2·H·n·d_k and the weighted values 2·H·k·d per token instead of the MLP;
    * adaptive input: every cluster's projection 2·d_i·d per input token;
    * transparent attention: the mix, 2·(N + 1)·M·S·d.
    """
    d, a = config.d_model, config.num_heads * config.head_dim
    dense = attention = 0.0
    if config.convolution != "none":
        k, h = config.conv_kernel_size, config.conv_groups or config.num_heads
        per_token = 2 * 3 * d * d - 2 * 4 * d * a + 2 * d * k
        if config.conv_pointwise:
            per_token += 2 * d * d
        if config.convolution == "dynamic":
            per_token += 2 * d * h * k
        for layers, n, cf in ((n_enc if enc else 0, s, 1.0), (n_dec if dec else 0, t,
                                                               causal_factor)):
            dense += layers * n * per_token
            attention -= layers * 4 * n * n * a * cf
    if config.funnel_blocks and enc:
        lengths, pooled = [s], s
        for _ in config.funnel_blocks[1:]:
            pooled = -(-pooled // 2)
            lengths.append(pooled)
        dense -= n_enc * s * per_token_layer
        attention -= n_enc * 4 * s * s * a
        for i, depth in enumerate(config.funnel_blocks):
            n, prev = lengths[i], lengths[max(i - 1, 0)]
            dense += depth * n * per_token_layer + 2 * 2 * d * a * (prev - n)  # k, v unpooled
            attention += 4 * n * prev * a + (depth - 1) * 4 * n * n * a
        if dec:
            dense += n_dec * 2 * 2 * d * a * (pooled - s)
            attention += n_dec * 4 * t * (pooled - s) * a
    if config.pkm_layers and dec:
        h, n, dk = config.pkm_heads, config.pkm_num_keys, config.pkm_key_dim
        mlp = (len(config.mlp_activations) + 1) * 2 * d * config.d_ff
        memory = 2 * d * h * dk + 2 * h * n * dk + 2 * h * config.pkm_topk * d
        dense += len(config.pkm_layers) * t * (memory - mlp)
    if config.adaptive_input:
        if config.adaptive_softmax_projection:
            dense += (s * enc + t * dec) * sum(2 * w * d for w in cluster_widths(config))
    if config.transparent_attention and enc and dec:
        dense += 2 * (n_enc + 1) * n_dec * s * d
    return dense, attention


def _layer_type_delta(config: TransformerConfig, enc_on: bool, dec_on: bool, s: int, t: int,
                      n_enc: int, n_dec: int, causal_factor: float) -> tuple[float, float]:
    """(dense, attention) FLOPs that `layer_type` adds to the plain count of one example:

    * "weighted" (t2t/nn/weighted.py): every head's branch passes the FFN, ``F = (g+1)·2·d·F``
      per token: H·F per branched attention (two in an encoder-decoder's decoder layer)
      against the plain layer's one;
    * "evolved" (t2t/nn/evolved.py), per token: encoder cell GLU 2·d·2d, 1x1 2·d·4d,
      3x1 2·3·d·d/2, separable 9x1 2·9·4d + 2·4d·d/2; decoder cell the 2H-head
      self-attention branch (2·4·d·2A, 4·T²·2A causal) and cross-attention branch, the
      separable 11x1 (2·11·d + 2·d·2d) and 7x1 convolutions (2·7·d + 2·d·d/2,
      2·7·2d + 2·2d·d), and its Swish FFN (one activation) in place of the config's.
    """
    d, a, h = config.d_model, config.num_heads * config.head_dim, config.num_heads
    ffn = (len(config.mlp_activations) + 1) * 2 * d * config.d_ff
    enc = n_enc if enc_on else 0
    dec = n_dec if dec_on else 0
    cross = enc_on and dec_on
    dense = attention = 0.0
    if config.layer_type == "weighted":
        dense = enc * s * (h - 1) * ffn + dec * t * ((2 if cross else 1) * h - 1) * ffn
    elif config.layer_type == "evolved":
        dense += enc * s * (2 * d * 2 * d + 2 * d * 4 * d + 2 * 3 * d * (d // 2)
                            + 2 * 9 * 4 * d + 2 * 4 * d * (d // 2))
        per_token = (2 * 4 * d * 2 * a + 2 * 11 * d + 2 * d * 2 * d + 2 * 7 * d
                     + 2 * d * (d // 2) + 2 * 7 * 2 * d + 2 * 2 * d * d
                     + (2 - len(config.mlp_activations) - 1) * 2 * d * config.d_ff)
        dense += dec * (t * per_token + (2 * 2 * d * a * (t + s) if cross else 0))
        attention += dec * (4 * t * t * 2 * a * causal_factor + (4 * t * s * a if cross else 0))
    return dense, attention


def forward_flops_breakdown(config: TransformerConfig, family: str, *,
                            input_length: Optional[int] = None,
                            target_length: Optional[int] = None,
                            num_masked: Optional[int] = None,
                            causal: Optional[bool] = None) -> dict[str, float]:
    """Forward FLOPs of ONE example, split into ``dense``, ``attention``, ``logits``.

    ``causal`` applies to decoder self-attention (default True; False for a fully
    bidirectional count); the encoder is never causal. Layers are counted as dot-product
    attention and dense FFNs (the Universal Transformer's steps as layers; synthesizer
    self-attention by `_synthesizer_delta`). A family with a formula of its own (ELMo:
    `t2t.models.elmo.forward_flops`, an ``ElmoConfig``, ``target_length`` tokens) counts
    itself.
    """
    counted = formula(family)
    s, t = _lengths(family, counted, input_length, target_length)
    if counted.forward is not None:
        return counted.forward(config, input_length=s, target_length=t, num_masked=num_masked,
                               causal=causal)
    enc, dec = counted.encoder, counted.decoder
    d, a, f, v = config.d_model, config.num_heads * config.head_dim, config.d_ff, config.vocab_size
    per_token_layer = 2 * (4 * d * a + (len(config.mlp_activations) + 1) * d * f)
    causal_factor = 0.5 if (True if causal is None else causal) else 1.0
    # a Universal Transformer runs its one layer `universal_steps` times per stack
    n_enc = config.universal_steps or config.num_encoder_layers
    n_dec = config.universal_steps or config.num_decoder_layers
    dense = attention = 0.0
    if enc:
        dense += n_enc * s * per_token_layer
        attention += 4 * a * encoder_scored_pairs(config, s, n_enc)
        dense, attention = (x + n_enc * y for x, y in zip(
            (dense, attention), _synthesizer_delta(config, s, 1.0)))
    if dec:
        dense += n_dec * t * per_token_layer
        attention += n_dec * 4 * t * t * a * causal_factor
        dense, attention = (x + n_dec * y for x, y in zip(
            (dense, attention), _synthesizer_delta(config, t, causal_factor)))
    if enc and dec:
        dense += n_dec * 2 * 2 * d * a * (t + s)
        attention += n_dec * 4 * t * s * a
    dense, attention = (x + y for x, y in zip((dense, attention), _part_b_delta(
        config, enc, dec, s, t, n_enc, n_dec, causal_factor, per_token_layer)))
    dense, attention = (x + y for x, y in zip((dense, attention), _layer_type_delta(
        config, enc, dec, s, t, n_enc, n_dec, causal_factor)))
    if dec:
        positions = t
    else:
        positions = s if num_masked is None else num_masked
    e = config.embedding_dim
    logits = 2 * (e or d) * v * positions
    if e:
        dense += 2 * e * d * (s + t)  # embedding projection E -> d on every input token
        logits += 2 * d * e * positions  # head projection d -> E
    if config.output_layer != "softmax":    # adaptive softmax, mixture of softmaxes
        logits = _output_layer_logits(config) * positions
    return {"dense": float(dense), "attention": float(attention), "logits": float(logits)}


def step_flops(config: TransformerConfig, family: str, batch_size: int, *,
               input_length: Optional[int] = None, target_length: Optional[int] = None,
               num_masked: Optional[int] = None, causal: Optional[bool] = None) -> float:
    """Training FLOPs of one step (forward + backward = 3 × forward) for a whole batch."""
    parts = forward_flops_breakdown(config, family, input_length=input_length,
                                    target_length=target_length, num_masked=num_masked,
                                    causal=causal)
    return 3.0 * batch_size * sum(parts.values())


def tokens_per_example(family: str, input_length: Optional[int] = None,
                       target_length: Optional[int] = None) -> int:
    """S (encoder), T (decoder or ELMo) or S + T (encoder-decoder)."""
    s, t = _lengths(family, formula(family), input_length, target_length)
    return s + t


def train_flops_per_token(config: TransformerConfig, family: str, *,
                          input_length: Optional[int] = None,
                          target_length: Optional[int] = None,
                          num_masked: Optional[int] = None,
                          causal: Optional[bool] = None) -> float:
    """Training FLOPs per processed token (see :func:`tokens_per_example`)."""
    total = step_flops(config, family, 1, input_length=input_length,
                       target_length=target_length, num_masked=num_masked, causal=causal)
    return total / tokens_per_example(family, input_length, target_length)


def mfu(flops_per_step: float, step_time_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over ``peak_flops`` (of all devices used)."""
    if step_time_s <= 0 or peak_flops <= 0:
        raise ValueError(f"step_time_s and peak_flops must be positive, got {step_time_s}, "
                         f"{peak_flops}")
    return flops_per_step / step_time_s / peak_flops


# Dense bf16 peak per JAX device (a TPU v2/v3 device is one core; v4+ is one chip).
_PEAK_BF16 = (
    ("tpu v2", 22.5e12), ("tpu v3", 61.5e12), ("tpu v4", 275e12), ("tpu v5 lite", 197e12),
    ("tpu v5e", 197e12), ("tpu v5p", 459e12), ("tpu v5", 459e12), ("tpu v6 lite", 918e12),
    ("tpu v6e", 918e12), ("h100 pcie", 756e12), ("h100", 989e12), ("h200", 989e12),
    ("a100", 312e12),
)


def measure_peak_flops(dtype: str = "float32", size: int = 2048, repeats: int = 5,
                       calls: Optional[int] = None) -> float:
    """Measured matmul FLOP/s of one device: a jitted [size, size]² product in `dtype` with
    float32 accumulation on random data (constant inputs run faster than real data on
    some accelerators), best of `repeats` timings of `calls` back-to-back products (default
    1 on a CPU; 10 on an accelerator, where one product is too short to time from the
    host). The ceiling MFU is reported against."""
    import time

    import jax.numpy as jnp

    if calls is None:
        calls = 1 if jax.devices()[0].platform == "cpu" else 10
    a = jnp.asarray(np.random.default_rng(0).standard_normal((size, size), np.float32), dtype)
    f = jax.jit(lambda x: jnp.matmul(x, x, preferred_element_type=jnp.float32))
    f(a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        outs = [f(a) for _ in range(calls)]
        jax.block_until_ready(outs)
        best = min(best, (time.perf_counter() - start) / calls)
    return 2.0 * size ** 3 / best


PEAK_CACHE_FILE = "peak_flops.json"   # under t2t.platforms.cache_dir()


def peak_cache_key(dtype: str) -> str:
    """What a measured peak depends on: the device (on a CPU its model, its matmul-relevant
    flags and its core count: cloud VMs of one model name differ in both), the dtype, JAX's
    version and XLA's flags (fake device counts, optimisation level)."""
    from t2t import precision
    device = jax.devices()[0]
    kind = device.device_kind
    if device.platform == "cpu":
        cpuinfo = precision.read_cpuinfo()
        flags = precision.cpu_flags(cpuinfo) or frozenset()
        kind = " ".join([precision.cpu_model(cpuinfo), f"{os.cpu_count()} cores",
                         *[f for f in precision.REPORTED_CPU_FLAGS if f in flags]])
    return " | ".join([device.platform, kind, dtype, f"jax {jax.__version__}",
                       os.environ.get("XLA_FLAGS", "").strip()])


def host_peak_flops(dtype: str = "float32", cache: Optional[str] = None) -> tuple[float, str]:
    """(peak FLOP/s per device, where it came from): `measure_peak_flops(dtype)`, measured once
    per host and kept in `cache` (default `cache_dir()/peak_flops.json`), so a run starts
    without the measurement and every run's MFU has the same denominator. Delete the file
    to measure again (e.g. after a first measurement on a busy machine)."""
    from t2t import storage
    from t2t.platforms import cache_dir
    path = Path(cache) if cache else cache_dir() / PEAK_CACHE_FILE
    key = peak_cache_key(dtype)
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not isinstance(table, dict):
        table = {}
    if isinstance(table.get(key), (int, float)) and table[key] > 0:
        return float(table[key]), f"measured earlier on this host, {path}"
    peak = measure_peak_flops(dtype)
    table[key] = peak
    try:                         # a read-only home only costs the next run a measurement
        storage.write_json_atomically(path, table)
    except OSError:
        pass
    return peak, f"measured now, kept in {path}"


def peak_flops_per_device(device: Optional[jax.Device] = None) -> Optional[float]:
    """Published dense bf16 peak of a known accelerator, or None (e.g. CPU)."""
    kind = (device or jax.devices()[0]).device_kind.lower()
    for key, peak in _PEAK_BF16:
        if key in kind:
            return peak
    return None
