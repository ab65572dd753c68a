"""ELECTRA's generator inputs (Clark et al. 2020, §2; the authors' code:
google-research/electra, `pretrain_helpers.mask`).

§2: the generator sees x^masked = REPLACE(x, m, [MASK]) for a random set m of k = ⌈15% of
n⌉ positions. The released code, which the paper's results come from, differs from BERT's
masking in two ways that this module follows:

* positions are single tokens drawn uniformly among the non-special tokens (no whole-word
  grouping), k = round(mask_rate · n) with n every real token of the row, [CLS]/[SEP]
  included, clipped to [1, max_predictions];
* a chosen position becomes [MASK] with probability 0.85 and keeps its token otherwise;
  there is no random-token replacement (BERT's 80/10/10): the generator's samples are the
  replacements the discriminator has to detect.

The generator predicts every chosen position (masked or kept). Its samples, the
discriminator's inputs and labels are built in the model (`t2t.models.electra`).
The reference draws positions with replacement (a TensorFlow convenience that can pick a
position twice); here they are a set, as §2 defines m.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from t2t.data.preprocessors import Seed, make_rng

MASK_TOKEN_PROB = 0.85      # pretrain_helpers.mask: tf.less(tf.random.uniform([B, N]), 0.85)


def electra_mask(tokens: Any, seed: Seed, mask_id: int, special_ids: Sequence[int],
                 mask_rate: float = 0.15, max_predictions: int = 20,
                 mask_token_prob: float = MASK_TOKEN_PROB) -> dict[str, np.ndarray]:
    """One row [L] -> ``inputs`` [L] (chosen positions [MASK] with `mask_token_prob`, else
    unchanged) and ``masked_positions`` / ``masked_ids`` / ``masked_weights``
    [max_predictions] (sorted by position, zero-padded)."""
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    rng = make_rng(seed)
    candidates = np.flatnonzero(~np.isin(tokens, np.asarray(special_ids, dtype=np.int32)))
    k = min(max_predictions, max(1, int(np.round(mask_rate * len(tokens)))), len(candidates))
    positions = np.sort(rng.choice(candidates, size=k, replace=False))        # [k]
    keep = rng.random(k) >= mask_token_prob                                    # [k]
    inputs = tokens.copy()
    inputs[positions[~keep]] = mask_id
    pad = max_predictions - k
    return {"inputs": inputs,
            "masked_positions": np.pad(positions.astype(np.int32), (0, pad)),
            "masked_ids": np.pad(tokens[positions], (0, pad)),
            "masked_weights": np.pad(np.ones(k, np.float32), (0, pad))}
