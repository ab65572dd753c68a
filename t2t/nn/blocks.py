"""One Transformer layer: self-attention, optional cross-attention, feed-forward.

Pre-LN (T5, GPT-2):  x + Drop(Sub(Norm(x)))
Post-LN (BERT):      Norm(x + Drop(Sub(x)))
`config.residual_scaling` gates the branch (ReZero's alpha, Fixup's scalars: t2t/nn/residual.py).
With `config.adapter_size`, Houlsby adapters wrap the self-attention's and the feed-forward's
Drop(Sub(.)) (adapter-bert's placement: after the dropout, before the residual sum).
"""
from __future__ import annotations

from typing import Optional

import flax.linen as nn
import jax

from t2t.nn.adapter import Adapter
from t2t.nn.attention import MultiHeadAttention
from t2t.nn.config import TransformerConfig
from t2t.nn.dropout import Dropout
from t2t.nn.lightweight_conv import ConvolutionBlock
from t2t.nn.mlp import MlpBlock
from t2t.nn.moe import MoeBlock
from t2t.nn.norms import make_norm
from t2t.nn.product_key import ProductKeyMemory
from t2t.nn.residual import ResidualGate


class LayerFields(nn.Module):
    """What a stack gives each of its layers (`TransformerLayer`, and the whole-layer
    replacements `layer_type` picks: t2t/nn/weighted.py, t2t/nn/evolved.py)."""

    config: TransformerConfig
    deterministic: bool = True
    decode: bool = False
    scanned: bool = False
    moe: bool = False
    pkm: bool = False
    causal: bool = False      # a decoder layer: its convolution looks back only
    linformer: bool = False   # self-attention keys/values projected n -> k (linformer.py)
    layer_index: int = 0      # its place in the stack (sparse attention patterns)


class TransformerLayer(LayerFields):
    """[batch, length, embed] -> [batch, length, embed].

    Cross-attention runs only when `encoded` is given, so one layer can serve both the
    encoder and the decoder (the T5 paper's shared encoder-decoder).
    `scanned=True` returns `(x, None)` for use under `nn.scan`; `moe=True` gives it
    mixture-of-experts feed-forward (`t2t.nn.moe`), `pkm=True` a product-key memory in its
    place (`t2t.nn.product_key`). `self_kv` [batch, k_len, embed], when given, is what
    self-attention reads keys and values from (the Funnel encoder's pool-query-only layer).
    """

    def setup(self):
        cfg = self.config
        attn = lambda name, decode, prefix=False, **kw: MultiHeadAttention(  # noqa: E731
            cfg, deterministic=self.deterministic, decode=decode, use_prefix=prefix, name=name,
            **kw)
        if cfg.convolution != "none":     # Wu et al. 2019 in place of self-attention
            self.self_attention = ConvolutionBlock(cfg, self.deterministic, self.decode,
                                                   self.causal, name="self_attention")
        else:
            self.self_attention = attn("self_attention", self.decode, True,
                                       synthetic=cfg.synthesizer != "none",
                                       low_rank=self.linformer, layer_index=self.layer_index)
        self.cross_attention = attn("cross_attention", False)
        ffn = MoeBlock if self.moe else ProductKeyMemory if self.pkm else MlpBlock
        self.mlp = ffn(cfg, deterministic=self.deterministic, name="mlp")
        self.self_attention_norm = make_norm(cfg, "self_attention_norm")
        self.cross_attention_norm = make_norm(cfg, "cross_attention_norm")
        self.mlp_norm = make_norm(cfg, "mlp_norm")
        self.dropout = Dropout(cfg.dropout_rate)
        gate = lambda name: (ResidualGate(cfg, name=name)  # noqa: E731  ReZero / Fixup
                             if cfg.residual_scaling != "none" else None)
        self.self_attention_gate = gate("self_attention_gate")
        self.cross_attention_gate = gate("cross_attention_gate")
        self.mlp_gate = gate("mlp_gate")
        if cfg.adapter_size:
            self.attention_adapter = Adapter(cfg, name="attention_adapter")
            self.mlp_adapter = Adapter(cfg, name="mlp_adapter")

    def _sublayer(self, x, norm, fn, adapter=None, gate=None):
        def out(h):
            y = self.dropout(fn(h), deterministic=self.deterministic)
            return y if adapter is None else adapter(y)

        if gate is None:                  # residual_scaling: the branch joins as it is
            gate = lambda h, branch: branch(h)  # noqa: E731
        if self.config.pre_norm:
            return x + gate(x, lambda h: out(norm(h)))
        return norm(x + gate(x, out))

    def __call__(self, x: jax.Array, encoded: Optional[jax.Array] = None,
                 self_mask=None, self_bias=None, cross_mask=None,
                 positions: Optional[jax.Array] = None, decode_index=None,
                 self_kv: Optional[jax.Array] = None):
        adapt = self.config.adapter_size > 0
        kv = (None if self_kv is None else
              self.self_attention_norm(self_kv) if self.config.pre_norm else self_kv)
        x = self._sublayer(x, self.self_attention_norm, lambda h: self.self_attention(
            h, h if kv is None else kv, self_mask, self_bias, positions, positions,
            decode_index), self.attention_adapter if adapt else None, self.self_attention_gate)
        if encoded is not None:
            x = self._sublayer(x, self.cross_attention_norm,
                               lambda h: self.cross_attention(h, encoded, cross_mask),
                               gate=self.cross_attention_gate)
        x = self._sublayer(x, self.mlp_norm, self.mlp, self.mlp_adapter if adapt else None,
                           self.mlp_gate)
        x = nn.with_logical_constraint(x, ("batch", "length", "embed"))
        self.sow("intermediates", "hidden_states", x)
        return (x, None) if self.scanned else x
