"""The three stacks: Encoder (BERT), Decoder (GPT; optional cross-attention) and
EncoderDecoder (T5). The Decoder with no `encoded` input is the decoder-only model; its
`decoder_causal_attention` input turns it into a prefix LM.
"""
from __future__ import annotations

import functools
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.errors import ConfigError
from t2t.nn.adaptive_softmax import AdaptiveSoftmax
from t2t.nn.attention import (OUT_NAME, QKV_NAMES, causal_mask, combine_masks,
                              prefix_lm_mask, segment_mask)
from t2t.nn.attention_kernels import cudnn_structure, structured_mask
from t2t.nn.blocks import TransformerLayer
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import Dense, kernel_init
from t2t.nn.dropout import Dropout
from t2t.nn.embed import Embed, Embedder, project_embeddings, token_embed
from t2t.nn.evolved import EvolvedLayer
from t2t.nn.funnel import FunnelStack, pool_segments_to
from t2t.nn.mixture_of_softmaxes import MixtureOfSoftmaxes
from t2t.nn.moe import MOE_COLLECTION, is_moe_layer
from t2t.nn.norms import make_norm
from t2t.nn.position import RelativePositionBias
from t2t.nn.product_key import is_pkm_layer
from t2t.nn.sparse_attention import token_mask
from t2t.nn.transparent import TransparentMix, layer_memory
from t2t.nn.universal import UniversalStack
from t2t.nn.weighted import WeightedLayer

REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole layer
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    # by the names attention.py gives its projections (MaxText's save_qkv_proj and
    # save_out_proj): everything else in the layer is recomputed
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(*QKV_NAMES),
    "save_qkv_out_proj": jax.checkpoint_policies.save_only_these_names(*QKV_NAMES, OUT_NAME),
}


def _layer_class(config: TransformerConfig, scanned: bool):
    layer = {"weighted": WeightedLayer, "evolved": EvolvedLayer}.get(config.layer_type,
                                                                     TransformerLayer)
    if config.remat_policy == "none":
        return layer
    return nn.remat(layer, policy=REMAT_POLICIES[config.remat_policy],
                    prevent_cse=not scanned)


def _default_positions(tokens: jax.Array) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)


class LayerStack(nn.Module):
    """`num_layers` layers: a Python loop, one shared layer (ALBERT), or `nn.scan`.

    `stack` ("encoder" / "decoder") decides sharing under `config.share_layers_in`.
    `encoded` [b, l, d] is every layer's memory, or [b, num_layers, l, d] one per layer
    (transparent attention). `return_all=True` returns (x, [input, layer outputs...]).
    """

    config: TransformerConfig
    num_layers: int
    stack: str = "both"

    @nn.compact
    def __call__(self, x, encoded=None, self_mask=None, self_bias=None, cross_mask=None,
                 positions=None, decode_index=None, *, deterministic=True, decode=False,
                 return_all=False):
        cfg = self.config
        shared = cfg.share_layers and cfg.share_layers_in in ("both", self.stack)
        linformer = self.stack == "encoder" and cfg.linformer_k > 0   # t2t/nn/linformer.py
        if (self_bias is not None and not decode and self.num_layers > 1
                and not cudnn_structure(cfg)):
            # One bias shared by every layer (T5's relative positions) is broadcast over the
            # batch once, here: its gradient then sums the layers' [b, h, q, k] cotangents
            # and reduces over the batch once, instead of once per layer (XLA:CPU's per-layer
            # reductions were measurable in a T5.1.1-base train step: benchmarks/README.md).
            # cuDNN with attention_structure takes it [1, h, q, k] and reduces it itself.
            self_bias = jnp.broadcast_to(self_bias, (x.shape[0],) + self_bias.shape[1:])
        args = (encoded, self_mask, self_bias, cross_mask, positions, decode_index)
        if cfg.universal_steps:         # one recurrent layer (t2t/nn/universal.py)
            out = UniversalStack(cfg, deterministic, decode, name="universal")(x, *args)
            return (out, [x, out]) if return_all else out
        if cfg.scan_layers and not shared:
            scanned = nn.scan(_layer_class(cfg, scanned=True),
                              variable_axes={"params": 0, "cache": 0, "intermediates": 0,
                                             MOE_COLLECTION: 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=(nn.broadcast,) * len(args), length=self.num_layers,
                              metadata_params={nn.PARTITION_NAME: "layers"})
            x, _ = scanned(cfg, deterministic, decode, scanned=True,      # moe_every is 1
                           moe=is_moe_layer(cfg, 0), linformer=linformer,
                           causal=self.stack == "decoder", name="layer")(x, *args)
            return x
        if shared and decode:
            return self._shared_with_caches(x, args, deterministic, linformer)
        cls = functools.partial(_layer_class(cfg, scanned=False), causal=self.stack == "decoder")
        states = [x]
        layer = None
        for i in range(self.num_layers):
            if not shared:
                layer = cls(cfg, deterministic, decode, moe=is_moe_layer(cfg, i),
                            pkm=is_pkm_layer(cfg, i, self.stack), linformer=linformer,
                            layer_index=i, name=f"layer_{i}")
            elif layer is None:
                layer = cls(cfg, deterministic, decode, moe=is_moe_layer(cfg, 0),
                            linformer=linformer, name="layer")
            x = layer(x, layer_memory(encoded, i), *args[1:])
            states.append(x)
        if return_all:
            return x, states
        return x

    def _shared_with_caches(self, x, args, deterministic, linformer):
        """The shared layer applied num_layers times while decoding: the same parameters
        (broadcast, named "layer" as in the loop) but a KV cache per application, stacked
        [num_layers, ...] (one module's cache would be overwritten by its next call)."""
        cfg = self.config
        encoded = args[0]
        per_layer = encoded is not None and encoded.ndim == 4    # transparent: [b, M, l, d]
        scanned = nn.scan(_layer_class(cfg, scanned=True), variable_broadcast="params",
                          variable_axes={"cache": 0, "intermediates": 0, MOE_COLLECTION: 0},
                          split_rngs={"params": False, "dropout": True},
                          in_axes=(1 if per_layer else nn.broadcast,)
                          + (nn.broadcast,) * (len(args) - 1), length=self.num_layers)
        x, _ = scanned(cfg, deterministic, True, scanned=True, moe=is_moe_layer(cfg, 0),
                       linformer=linformer, causal=self.stack == "decoder",
                       name="layer")(x, *args)
        return x


def _final_norm(cfg: TransformerConfig, x, deterministic):
    """Pre-LN stacks end with a norm (and T5's dropout); post-LN stacks already did."""
    if not cfg.pre_norm:
        return x
    x = make_norm(cfg, "final_norm")(x)
    return Dropout(cfg.dropout_rate)(x, deterministic=deterministic)


class Encoder(nn.Module):
    """tokens [batch, length] -> hidden states [batch, length, d_model].

    Bidirectional, or left-to-right with `config.encoder_causal` (a causal mask combined
    with the packing/padding mask: position i sees keys j <= i of its own segment).
    `embedder` may be passed in to share all embeddings with another stack (ELECTRA).
    `all_layers=True` returns every state, the embedding output first, through the final
    norm: [batch, layers + 1, length, d_model] (transparent attention, `t2t.nn.transparent`).
    With `config.funnel_blocks` the layers pool the sequence (`t2t.nn.funnel`): the output
    is [batch, ceil(length / 2^(blocks-1)), d_model].
    With a sparse `config.attention_pattern` the layers get a `TokenMask`
    (`t2t.nn.sparse_attention`) instead of the [b, 1, l, l] mask; `global_tokens` [batch,
    length] (1 = global; Longformer's, HF's `global_attention_mask`) rides on it.
    """

    config: TransformerConfig
    token_embedder: Optional[Embed] = None
    layer_stack: Optional[LayerStack] = None
    embedder: Optional[Embedder] = None
    all_layers: bool = False

    @nn.compact
    def __call__(self, input_tokens: jax.Array, segment_ids: Optional[jax.Array] = None,
                 positions: Optional[jax.Array] = None,
                 token_type_ids: Optional[jax.Array] = None, *,
                 deterministic: bool = True,
                 global_tokens: Optional[jax.Array] = None) -> jax.Array:
        cfg = self.config
        if global_tokens is not None and cfg.attention_pattern != "sliding_window":
            raise ConfigError("global_tokens (a global_attention_mask) need "
                              "attention_pattern='sliding_window' (Longformer)")
        if positions is None:
            positions = _default_positions(input_tokens)
        if cfg.position_offset:
            positions = positions + cfg.position_offset
        if self.embedder is not None:
            x = self.embedder(input_tokens, positions, token_type_ids, deterministic)
        else:
            table = token_embed(cfg) if self.token_embedder is None else self.token_embedder
            x = Embedder(cfg, table, deterministic, name="embedder")(input_tokens, positions,
                                                                     token_type_ids)
        x = project_embeddings(cfg, x)                             # [b, l, d_model]
        if cfg.funnel_blocks:
            x = FunnelStack(cfg, _layer_class(cfg, scanned=False), name="layers")(
                x, segment_ids, deterministic=deterministic)          # [b, pooled, d_model]
            return _final_norm(cfg, x, deterministic)
        if cfg.attention_pattern != "dense":      # t2t/nn/sparse_attention.py
            mask = token_mask(input_tokens, segment_ids, global_tokens)
        else:
            mask = combine_masks(  # [batch|1, 1, length, length]
                causal_mask(input_tokens.shape[1]) if cfg.encoder_causal else None,
                None if segment_ids is None else segment_mask(segment_ids, segment_ids))
            mask = structured_mask(cfg, mask, segment_ids, segment_ids, cfg.encoder_causal)
        bias = None
        if cfg.position_embedding == "relative":
            idx = jnp.arange(input_tokens.shape[1])
            bias = RelativePositionBias(cfg, bidirectional=True, name="relpos")(idx, idx)
        stack = self.layer_stack or LayerStack(cfg, cfg.num_encoder_layers, "encoder",
                                               name="layers")
        if self.all_layers:
            _, states = stack(x, None, mask, bias, None, positions, None,
                              deterministic=deterministic, return_all=True)
            return _final_norm(cfg, jnp.stack(states, axis=1), deterministic)  # [b, N+1, l, d]
        x = stack(x, None, mask, bias, None, positions, None, deterministic=deterministic)
        return _final_norm(cfg, x, deterministic)


class Decoder(nn.Module):
    """Causal stack: tokens [batch, length] -> logits [batch, length, vocab].

    With `encoded` it cross-attends (T5's decoder); without, it is a GPT-style LM.
    `decoder_causal_attention` (1 over the prefix) makes it a prefix LM.
    With `decode=True` the first call sizes the KV cache from its input length; each
    later call feeds the next token(s) and reads/writes the cache. A later call may feed a
    whole prompt at once (prefill), with positions, padding and a prefix-LM mask; see
    `t2t.models.decoding`.
    """

    config: TransformerConfig
    token_embedder: Optional[Embed] = None
    layer_stack: Optional[LayerStack] = None

    @nn.compact
    def __call__(self, decoder_input_tokens: jax.Array, encoded: Optional[jax.Array] = None,
                 decoder_segment_ids: Optional[jax.Array] = None,
                 encoder_segment_ids: Optional[jax.Array] = None,
                 decoder_positions: Optional[jax.Array] = None,
                 decoder_causal_attention: Optional[jax.Array] = None, *,
                 deterministic: bool = True, decode: bool = False,
                 return_hidden: bool = False) -> jax.Array:
        cfg = self.config
        if not cfg.fully_visible_prefix:
            decoder_causal_attention = None        # a plain causal LM over inputs+targets
        tokens = decoder_input_tokens
        batch, length = tokens.shape
        relpos = (RelativePositionBias(cfg, bidirectional=False, name="relpos")
                  if cfg.position_embedding == "relative" else None)
        decode_index = None
        if decode and self.has_variable("cache", "index"):
            # One decoding step or a multi-token prefill: queries at cache slots
            # index .. index+length-1. Optional inputs, for prompts: `decoder_positions`
            # (per-example positions, e.g. of left-padded prompts), `decoder_segment_ids`
            # (0 marks padding slots, never attended, remembered in the cache) and
            # `decoder_causal_attention` (prefix-LM prefill: the flagged slots of this call
            # attend each other; pass the whole prefix in one call).
            index = self.variable("cache", "index", jnp.zeros, (), jnp.int32)
            key_positions = self.variable("cache", "key_positions", jnp.arange, 0).value
            key_segments = self.variable("cache", "segment_ids", jnp.ones, (batch, 0), jnp.int32)
            decode_index = index.value
            q_pos = decode_index + jnp.arange(length, dtype=jnp.int32)
            positions = (jnp.broadcast_to(q_pos, (batch, length)) if decoder_positions is None
                         else decoder_positions)
            positions = positions + cfg.position_offset
            self_mask = (key_positions[None, :] <= q_pos[:, None])[None, None]
            if decoder_causal_attention is not None:
                prefix_q = decoder_causal_attention.astype(bool)          # [b, length]
                prefix_k = jax.lax.dynamic_update_slice(
                    jnp.zeros((batch, key_positions.shape[0]), bool), prefix_q, (0, decode_index))
                self_mask = self_mask | (prefix_q[:, :, None] & prefix_k[:, None, :])[:, None]
            q_segments = (jnp.ones((batch, length), jnp.int32) if decoder_segment_ids is None
                          else decoder_segment_ids.astype(jnp.int32))
            key_segments.value = jax.lax.dynamic_update_slice(key_segments.value, q_segments,
                                                              (0, decode_index))
            self_mask = combine_masks(self_mask, segment_mask(q_segments, key_segments.value))
            self_bias = None if relpos is None else relpos(q_pos, key_positions)
            index.value = decode_index + length
        else:
            if decode:  # cache initialisation: remember the maximum decode length
                self.variable("cache", "index", jnp.zeros, (), jnp.int32)
                self.variable("cache", "key_positions", jnp.arange, length, dtype=jnp.int32)
                self.variable("cache", "segment_ids", jnp.ones, (batch, length), jnp.int32)
            positions = (_default_positions(tokens) if decoder_positions is None
                         else decoder_positions)
            positions = positions + cfg.position_offset
            self_mask = (causal_mask(length) if decoder_causal_attention is None
                         else prefix_lm_mask(decoder_causal_attention))
            if decoder_segment_ids is not None:
                self_mask = combine_masks(self_mask, segment_mask(decoder_segment_ids,
                                                                  decoder_segment_ids))
            if decoder_causal_attention is None and not decode:
                self_mask = structured_mask(cfg, self_mask, decoder_segment_ids,
                                            decoder_segment_ids, causal=True)
            idx = jnp.arange(length)
            self_bias = None if relpos is None else relpos(idx, idx)

        if encoded is not None and encoded.ndim == 4:   # transparent attention: [b, N+1, l, d]
            encoded = TransparentMix(cfg, cfg.num_decoder_layers, name="transparent_mix")(encoded)
        if encoded is not None and encoder_segment_ids is not None:   # funnel: pooled memory
            encoder_segment_ids = pool_segments_to(encoder_segment_ids, encoded.shape[-2])
        cross_mask = None
        if encoded is not None and encoder_segment_ids is not None:
            q_segments = (jnp.ones_like(tokens) if decoder_segment_ids is None or decode
                          else decoder_segment_ids)
            cross_mask = segment_mask(q_segments, encoder_segment_ids)
            if not decode:
                cross_mask = structured_mask(cfg, cross_mask, q_segments, encoder_segment_ids)

        table = token_embed(cfg) if self.token_embedder is None else self.token_embedder
        x = Embedder(cfg, table, deterministic, name="embedder")(tokens, positions)
        x = project_embeddings(cfg, x)
        stack = self.layer_stack or LayerStack(cfg, cfg.num_decoder_layers, "decoder",
                                               name="layers")
        x = stack(x, encoded, self_mask, self_bias, cross_mask, positions, decode_index,
                  deterministic=deterministic, decode=decode)
        x = _final_norm(cfg, x, deterministic)
        if return_hidden:
            return x
        return nn.with_logical_constraint(output_logits(cfg, x, table),
                                          ("batch", "length", "vocab"))


def output_logits(cfg: TransformerConfig, x: jax.Array, table: Embed) -> jax.Array:
    """[batch, length, d_model] -> [batch, length, vocab]; tied or its own `logits_dense`.

    `config.output_layer` "adaptive_softmax" / "mixture_of_softmaxes" return normalised
    log-probabilities instead, which the losses, scoring and decoding take as logits.
    Call from inside a compact module (it creates params in the caller's scope).
    """
    if cfg.output_layer == "adaptive_softmax":                        # log-probabilities
        if cfg.tie_embeddings:                                         # adaptive input's
            return table.log_probs(x)
        return AdaptiveSoftmax(cfg, name="adaptive_softmax")(x)
    if cfg.output_layer == "mixture_of_softmaxes":                    # log-probabilities
        return MixtureOfSoftmaxes(cfg, name="mixture_of_softmaxes")(
            x, lambda h: _word_logits(cfg, h, table))
    logits = _word_logits(cfg, x, table)
    if cfg.final_logits_bias:   # BART's [vocab] bias on the logits
        logits = logits + LogitsBias(cfg, name="final_logits_bias")(logits)
    return logits


class LogitsBias(nn.Module):
    """BART's `final_logits_bias`: a [vocab] param (zeros at init) added to the logits."""

    config: TransformerConfig

    @nn.compact
    def __call__(self, logits: jax.Array) -> jax.Array:
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                          (self.config.vocab_size,), self.config.params_dtype)
        return bias.astype(logits.dtype)


def _word_logits(cfg: TransformerConfig, x: jax.Array, table: Embed) -> jax.Array:
    """The softmax layer: [..., d_model] -> [..., vocab] (see `output_logits`)."""
    if not cfg.tie_embeddings:
        return Dense(cfg.vocab_size, ("embed", "vocab"), use_bias=False, dtype=cfg.compute_dtype,
                     param_dtype=cfg.params_dtype, kernel_init=kernel_init(cfg),
                     name="logits_dense")(x)
    if cfg.scale_tied_logits:
        x = x * jnp.asarray(cfg.d_model ** -0.5, x.dtype)
    if cfg.embedding_dim is not None and cfg.embedding_dim != cfg.d_model:
        x = Dense(cfg.embedding_dim, ("embed", None), use_bias=cfg.use_bias,
                  dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                  kernel_init=kernel_init(cfg), name="logits_projection")(x)
    return table.attend(x)


class EncoderDecoder(nn.Module):
    """T5: encoder and decoder sharing one token table (and, optionally, their layers)."""

    config: TransformerConfig

    def setup(self):
        cfg = self.config
        self.token_embedder = token_embed(cfg, "token_embedder")
        encoder_table = (self.token_embedder if cfg.share_input_embeddings
                         else token_embed(cfg, "encoder_token_embedder"))
        shared = None
        if cfg.share_encoder_decoder:
            if cfg.num_encoder_layers != cfg.num_decoder_layers:
                raise ValueError("share_encoder_decoder needs num_encoder_layers == "
                                 f"num_decoder_layers, got {cfg.num_encoder_layers} and "
                                 f"{cfg.num_decoder_layers}")
            shared = LayerStack(cfg, cfg.num_encoder_layers, name="shared_layers")
        self.encoder = Encoder(cfg, encoder_table, shared, all_layers=cfg.transparent_attention,
                               name="encoder")
        self.decoder = Decoder(cfg, self.token_embedder, shared, name="decoder")

    def encode(self, encoder_input_tokens, encoder_segment_ids=None, encoder_positions=None, *,
               deterministic: bool = True):
        """[batch, in_len] -> [batch, in_len, d_model]."""
        return self.encoder(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                            deterministic=deterministic)

    def decode(self, encoded, decoder_input_tokens, encoder_segment_ids=None,
               decoder_segment_ids=None, decoder_positions=None, *,
               deterministic: bool = True, decode: bool = False):
        """-> logits [batch, tgt_len, vocab]."""
        return self.decoder(decoder_input_tokens, encoded, decoder_segment_ids,
                            encoder_segment_ids, decoder_positions,
                            deterministic=deterministic, decode=decode)

    def __call__(self, encoder_input_tokens, decoder_input_tokens, encoder_segment_ids=None,
                 decoder_segment_ids=None, encoder_positions=None, decoder_positions=None, *,
                 deterministic: bool = True, decode: bool = False):
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions,
                              deterministic=deterministic)
        return self.decode(encoded, decoder_input_tokens, encoder_segment_ids,
                           decoder_segment_ids, decoder_positions,
                           deterministic=deterministic, decode=decode)
