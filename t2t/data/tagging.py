"""Token tagging (CoNLL NER, BIO tags) as BERT features, and back to one tag per word.

Each sentence becomes ``[CLS] pieces [SEP]``: every word's WordPiece sub-tokens, the first
of them carrying the word's tag id in ``tag_labels`` (the rest, the specials and padding
-1, as Devlin et al. 2019, sec. 5.3). Words whose pieces do not fit ``max_length`` are
cut: `TagFeatures.first` says where each kept word starts, and `word_tags` gives cut words
the tag "O".
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class TagFeatures:
    """A split's sentences as model features and the way back to their words."""

    features: dict[str, np.ndarray]   # encoder_input_tokens, encoder_segment_ids,
                                      # token_type_ids, tag_labels [n, max_length]
    first: list[list[int]]            # per sentence: each kept word's first position
    words: list[list[str]]
    truncated: int                    # sentences with words cut


def tag_features(records: Sequence[Mapping[str, Any]], vocabulary: Any,
                 label_names: Sequence[str], max_length: int) -> TagFeatures:
    """``{"tokens", "tags"}`` records -> `TagFeatures` (an unknown tag gets label -1)."""
    index = {name: i for i, name in enumerate(label_names)}
    n = len(records)
    tokens = np.full((n, max_length), vocabulary.pad_id, np.int32)
    labels = np.full((n, max_length), -1, np.int32)
    segments = np.zeros((n, max_length), np.int32)
    first, truncated = [], 0
    for row, record in enumerate(records):
        pieces = vocabulary.encode_batch(list(record["tokens"]), add_special_tokens=False)
        ids, starts = [vocabulary.cls_id], []
        for word_pieces, tag in zip(pieces, record["tags"]):
            word_pieces = word_pieces or [vocabulary.unk_id]
            if len(ids) + len(word_pieces) > max_length - 1:
                truncated += 1
                break
            starts.append(len(ids))
            labels[row, len(ids)] = index.get(tag, -1)
            ids += word_pieces
        ids.append(vocabulary.sep_id)
        tokens[row, :len(ids)], segments[row, :len(ids)] = ids, 1
        first.append(starts)
    features = {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
                "token_type_ids": np.zeros_like(tokens), "tag_labels": labels}
    return TagFeatures(features, first, [list(r["tokens"]) for r in records], truncated)


def word_tags(predicted: np.ndarray, tags: TagFeatures, label_names: Sequence[str]
              ) -> list[list[str]]:
    """Predicted tag ids [n, max_length] -> one tag name per word ("O" for cut words)."""
    out = []
    for row, (starts, words) in enumerate(zip(tags.first, tags.words)):
        kept = [label_names[int(predicted[row, p])] for p in starts]
        out.append(kept + ["O"] * (len(words) - len(kept)))
    return out
