"""Adaptive input embeddings (Baevski & Auli 2019, "Adaptive Input Representations for
Neural Language Modeling", sec. 3), optionally tied to an adaptive softmax (sec. 3,
"weight sharing"; Grave et al. 2017 for the softmax).

The vocabulary is split into the adaptive softmax's clusters
(`t2t.nn.adaptive_softmax.cluster_bounds`, ids sorted by decreasing frequency). Cluster i
has a table T_i of width d_i = d_model / factor**i and a linear projection P_i (no bias)
to d_model, so rare words get fewer parameters; a token's embedding is its cluster's row,
projected (every cluster, the head included, has its projection). With
`adaptive_softmax_projection=False` every cluster is d_model wide and unprojected.

Tied to the output (`tie_embeddings=True` with `output_layer="adaptive_softmax"`), the same
tables and projections score the clusters' words: cluster i's logits are
(h · P_iᵀ) · T_iᵀ; the head also scores the n tail clusters against `cluster_rows`
[n, d_0]; then p(w) = p_head(cluster of w) · p_cluster(w) as in the untied softmax.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from t2t.nn.adaptive_softmax import adaptive_log_probs, cluster_bounds, cluster_widths
from t2t.nn.config import TransformerConfig
from t2t.nn.dense import embedding_init, kernel_init


class AdaptiveInput(nn.Module):
    """ids [...] int -> embeddings [..., d_model]; stands in for the token table `Embed`.

    Parameters per cluster i: `cluster_{i}` [|V_i|, d_i] and (with the projection)
    `cluster_{i}_projection` [d_i, d_model]; with `with_softmax`, `cluster_rows` [n, d_0]
    and the method `log_probs` (the tied adaptive softmax).
    """

    config: TransformerConfig
    with_softmax: bool = False

    def setup(self):
        cfg = self.config
        bounds = cluster_bounds(cfg.vocab_size, cfg.adaptive_cutoffs)
        self.bounds = bounds
        param = lambda name, init, shape, axes: self.param(  # noqa: E731
            name, nn.with_logical_partitioning(init, axes), shape, cfg.params_dtype)
        self.tables = [param(f"cluster_{i}", embedding_init(cfg), (hi - lo, width), (None, None))
                       for i, (lo, hi, width) in enumerate(zip(bounds, bounds[1:],
                                                               cluster_widths(cfg)))]
        self.projections = [
            param(f"cluster_{i}_projection", kernel_init(cfg), (t.shape[1], cfg.d_model),
                  (None, "embed")) if cfg.adaptive_softmax_projection else None
            for i, t in enumerate(self.tables)]
        if self.with_softmax:
            self.cluster_rows = param("cluster_rows", embedding_init(cfg),
                                      (len(bounds) - 2, self.tables[0].shape[1]), (None, None))

    def _matmul(self, x, w, spec):
        dtype = self.config.compute_dtype
        return jnp.einsum(spec, x.astype(dtype), w.astype(dtype),
                          preferred_element_type=jnp.float32).astype(dtype)

    def __call__(self, ids: jax.Array) -> jax.Array:
        cfg = self.config
        out = jnp.zeros(ids.shape + (cfg.d_model,), cfg.compute_dtype)
        for i, (table, proj) in enumerate(zip(self.tables, self.projections)):
            lo, hi = self.bounds[i], self.bounds[i + 1]
            inside = (ids >= lo) & (ids < hi)                               # [...]
            rows = jnp.take(table, jnp.clip(ids - lo, 0, hi - lo - 1), axis=0)  # [..., d_i]
            h = rows.astype(cfg.compute_dtype) if proj is None else self._matmul(
                rows, proj, "...e,ed->...d")                                 # [..., d_model]
            out = jnp.where(inside[..., None], h, out)
        return out

    def log_probs(self, x: jax.Array) -> jax.Array:
        """The tied adaptive softmax: hidden [..., d_model] -> log p [..., vocab] (float32).
        `scale_tied_logits` scales the hidden state by d_model ** -0.5 first, as for a tied
        token table (the tables are initialised like it)."""
        if self.config.scale_tied_logits:
            x = x * jnp.asarray(self.config.d_model ** -0.5, x.dtype)
        logits = []
        for i, (table, proj) in enumerate(zip(self.tables, self.projections)):
            h = x if proj is None else self._matmul(x, proj, "...d,ed->...e")   # [..., d_i]
            if i == 0:
                table = jnp.concatenate([table, self.cluster_rows], axis=0)     # [c_1 + n, d_0]
            logits.append(self._matmul(h, table, "...e,ve->...v"))
        return adaptive_log_probs(logits[0], logits[1:])
