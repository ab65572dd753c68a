"""SWAG-style multiple choice as BERT features (Devlin et al. 2019, sec. 4.4).

A record is a context and N candidate endings (``{"context", "endings", "label"}``): each
(context, ending) pair becomes one ``[CLS] context [SEP] ending [SEP]`` row (sentence A /
B; a Hugging Face tokenizer's own special tokens and types, `t2t.data.hf_tokenizer.
row_layout`: ``<s> context </s></s> ending </s>`` for RoBERTa's), longest-first truncated
to ``max_length``; the model scores each row from its first token's vector and a softmax
over the N scores picks the ending (`t2t.models.classifiers.MultipleChoice`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t2t.data.finetune_tasks import text, texts, truncate_pair
from t2t.data.hf_tokenizer import row_layout
from t2t.errors import UserError


def choice_record(record: Mapping[str, Any]) -> tuple[str, list[str], int]:
    """(context, endings, label) of a ``{"context", "endings", "label"}`` record (TFDS
    hellaswag's fields; bytes or str)."""
    return text(record["context"]), texts(record["endings"]), int(record["label"])


def choice_features(records: Sequence[Mapping[str, Any]], vocabulary: Any,
                    max_length: int) -> dict[str, np.ndarray]:
    """Records -> ``encoder_input_tokens``, ``encoder_segment_ids``, ``token_type_ids``
    [n, num_choices, max_length] int32 and ``label`` [n] int32 (-1: unlabelled, as TFDS's
    test splits). Every record must have the same number of endings."""
    parsed = [choice_record(r) for r in records]
    counts = {len(endings) for _, endings, _ in parsed}
    if len(counts) > 1:
        raise UserError(f"multiple choice: records have {sorted(counts)} endings; every "
                        "record needs the same number")
    n, c = len(parsed), counts.pop() if counts else 0
    tokens = np.full((n, c, max_length), vocabulary.pad_id, np.int32)
    types = np.zeros((n, c, max_length), np.int32)
    segments = np.zeros((n, c, max_length), np.int32)
    contexts = vocabulary.encode_batch([p[0] for p in parsed], add_special_tokens=False)
    endings = vocabulary.encode_batch([e for p in parsed for e in p[1]],
                                      add_special_tokens=False)
    layout = row_layout(vocabulary)     # the tokenizer's own special tokens and types
    for row, a in enumerate(contexts):
        for choice in range(c):
            b = endings[row * c + choice]
            la, lb = truncate_pair(len(a), len(b), max_length - layout.added(True))
            ids, kinds = layout.build(a[:la], b[:lb])
            tokens[row, choice, :len(ids)] = ids
            segments[row, choice, :len(ids)] = 1
            types[row, choice, :len(ids)] = kinds
    return {"encoder_input_tokens": tokens, "encoder_segment_ids": segments,
            "token_type_ids": types, "label": np.asarray([p[2] for p in parsed], np.int32)}
