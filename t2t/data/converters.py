"""Feature converters: task examples -> model features for each architecture.

Feature names and conventions follow seqio/t5x (see docs/design.md, "Features"). Every converter
does three things, split so the pipeline can run the first in workers and the rest once
per batch:

1. ``prepare(example) -> (packable, truncated_tokens)``: trim each feature to its length
   (truncation rule: keep the first ``length`` tokens, as seqio's trim; a trailing EOS can
   be cut) and lay it out as the 1-D arrays the packer places.
2. a ``FirstFitPacker`` (``new_packer``) places them in rows (one example per row unless
   ``pack``), producing ``*_segment_ids`` and ``*_positions``.
3. ``finalize(rows)`` computes the model features (shifted decoder inputs, loss weights...).

Unpacked batches also carry ``*_segment_ids`` (1 on tokens, 0 on padding) and positions.
``converter(examples)`` does all three for a list, for tests and small jobs.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t2t.data.packing import FirstFitPacker
from t2t.data.preprocessors import SkipExample


def shift_right(tokens: np.ndarray, positions: np.ndarray, segment_ids: np.ndarray,
                bos_id: int = 0) -> np.ndarray:
    """Decoder inputs: tokens shifted right by one within each packed segment.

    The first token of every segment is ``bos_id`` and padding is 0 (seqio's
    ``make_autoregressive_inputs`` with ``sequence_id``). [batch, length] -> same.
    """
    shifted = np.zeros_like(tokens)
    shifted[:, 1:] = tokens[:, :-1]
    shifted = np.where(positions == 0, np.int32(bos_id), shifted)
    return np.where(segment_ids > 0, shifted, 0).astype(np.int32)


def trim(value: Any, length: int) -> tuple[np.ndarray, int]:
    """(the first `length` ids of `value` as int32, how many were cut)."""
    value = np.asarray(value, dtype=np.int32).reshape(-1)
    return value[:length], max(len(value) - length, 0)


class FeatureConverter:
    """Base class; subclasses set ``packed_lengths`` and implement prepare/finalize."""

    scalar_keys: tuple[str, ...] = ()

    def __init__(self, lengths: Mapping[str, int], pack: bool = True):
        self.lengths = dict(lengths)
        self.pack = pack
        self.packed_lengths: dict[str, int] = {}

    def prepare(self, example: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
        raise NotImplementedError

    def finalize(self, rows: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def new_packer(self, num_rows: int) -> FirstFitPacker:
        return FirstFitPacker(self.packed_lengths, num_rows, scalar_keys=self.scalar_keys,
                              max_examples_per_row=None if self.pack else 1)

    def __call__(self, examples: Sequence[Mapping[str, Any]], num_rows: int | None = None
                 ) -> dict[str, np.ndarray]:
        """Converts a list of examples into one batch (as many rows as first fit needs)."""
        packer = self.new_packer(max(len(examples), num_rows or 0, 1))
        for example in examples:
            packable, _ = self.prepare(example)
            packer.add(packable)
        return self.finalize(packer.rows(num_rows))

    def empty_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        """An all-padding batch with the real shapes and dtypes (for model init)."""
        return self.finalize(self.new_packer(batch_size).rows(batch_size))


class EncDecConverter(FeatureConverter):
    """Encoder-decoder (T5): ``{"inputs", "targets"}`` with lengths ``{"inputs", "targets"}``."""

    def __init__(self, lengths: Mapping[str, int], pack: bool = True, bos_id: int = 0):
        super().__init__(lengths, pack)
        self.bos_id = bos_id
        self.packed_lengths = {"inputs": self.lengths["inputs"], "targets": self.lengths["targets"]}

    def prepare(self, example):
        inputs, cut_inputs = trim(example["inputs"], self.lengths["inputs"])
        targets, cut_targets = trim(example["targets"], self.lengths["targets"])
        if len(targets) == 0:
            raise SkipExample("empty")
        return {"inputs": inputs, "targets": targets}, cut_inputs + cut_targets

    def finalize(self, rows):
        seg, pos = rows["targets_segment_ids"], rows["targets_positions"]
        return {
            "encoder_input_tokens": rows["inputs"],  # [batch, inputs_length]
            "encoder_segment_ids": rows["inputs_segment_ids"],
            "encoder_positions": rows["inputs_positions"],
            "decoder_input_tokens": shift_right(rows["targets"], pos, seg, self.bos_id),
            "decoder_target_tokens": rows["targets"],  # [batch, targets_length]
            "decoder_loss_weights": (seg > 0).astype(np.float32),
            "decoder_segment_ids": seg,
            "decoder_positions": pos,
        }


class LMConverter(FeatureConverter):
    """Decoder-only LM: ``{"targets"}`` (or ``{"tokens"}``) with lengths ``{"targets": L}``."""

    def __init__(self, lengths: Mapping[str, int], pack: bool = True, bos_id: int = 0):
        super().__init__(lengths, pack)
        self.bos_id = bos_id
        self.packed_lengths = {"targets": self.lengths["targets"]}

    def prepare(self, example):
        targets = example["targets"] if "targets" in example else example["tokens"]
        targets, cut = trim(targets, self.lengths["targets"])
        if len(targets) == 0:
            raise SkipExample("empty")
        return {"targets": targets}, cut

    def finalize(self, rows):
        seg, pos = rows["targets_segment_ids"], rows["targets_positions"]
        return {
            "decoder_input_tokens": shift_right(rows["targets"], pos, seg, self.bos_id),
            "decoder_target_tokens": rows["targets"],  # [batch, length]
            "decoder_loss_weights": (seg > 0).astype(np.float32),
            "decoder_segment_ids": seg,
            "decoder_positions": pos,
        }


class PrefixLMConverter(FeatureConverter):
    """Decoder-only prefix LM: inputs and targets in one sequence of length inputs+targets.

    ``decoder_causal_attention`` is 1 over the inputs *and one more position* (the one
    reading the last input and predicting the first target), as seqio's
    ``PrefixLMFeatureConverter``; the loss is on the targets only unless
    ``loss_on_targets_only=False``. As in seqio the concatenation is trimmed to
    inputs+targets, so a short prefix leaves its room to long targets; but an over-long
    prefix is cut first so that up to ``targets`` target tokens always fit (fine-tuning on
    long documents keeps its answers).
    """

    def __init__(self, lengths: Mapping[str, int], pack: bool = True,
                 loss_on_targets_only: bool = True, bos_id: int = 0):
        super().__init__(lengths, pack)
        self.bos_id = bos_id
        self.loss_on_targets_only = loss_on_targets_only
        total = self.lengths["inputs"] + self.lengths["targets"]
        self.packed_lengths = {"targets": total, "inputs_width": total}

    def prepare(self, example):
        inputs = np.asarray(example["inputs"], np.int32).reshape(-1)
        targets = np.asarray(example["targets"], np.int32).reshape(-1)
        if len(targets) == 0:
            raise SkipExample("empty")
        total = self.packed_lengths["targets"]
        inputs, cut_inputs = trim(inputs, total - min(len(targets), self.lengths["targets"]))
        concat, cut = trim(np.concatenate([inputs, targets]), total)
        cut += cut_inputs
        width = np.full(len(concat), len(inputs), np.int32)
        return {"targets": concat, "inputs_width": width}, cut

    def finalize(self, rows):
        seg, pos = rows["targets_segment_ids"], rows["targets_positions"]
        width = rows["inputs_width"]
        real = seg > 0
        loss = real & (pos >= width) if self.loss_on_targets_only else real
        return {
            "decoder_input_tokens": shift_right(rows["targets"], pos, seg, self.bos_id),
            "decoder_target_tokens": rows["targets"],  # [batch, inputs+targets]
            "decoder_loss_weights": loss.astype(np.float32),
            "decoder_segment_ids": seg,
            "decoder_positions": pos,
            "decoder_causal_attention": (real & (pos < width + 1)).astype(np.int32),
        }


class EncoderConverter(FeatureConverter):
    """BERT MLM (+NSP): lengths ``{"inputs": L, "max_predictions": P}``.

    Examples carry ``inputs`` (already masked), ``token_type_ids``, ``masked_positions``,
    ``masked_ids``, ``masked_weights`` and, with ``nsp``, ``next_sentence_label``.
    Packing (MLM only: one NSP label per row cannot describe several pairs) offsets each
    example's masked positions by its start in the row; predictions past a truncation
    are dropped.
    """

    def __init__(self, lengths: Mapping[str, int], pack: bool = False, nsp: bool = True):
        super().__init__(lengths, pack)
        if pack and nsp:
            raise ValueError("EncoderConverter: packing is for MLM only; pass nsp=False")
        self.nsp = nsp
        self.scalar_keys = ("next_sentence_label",) if nsp else ()
        length, predictions = self.lengths["inputs"], self.lengths["max_predictions"]
        self.packed_lengths = {"inputs": length, "token_type_ids": length,
                               "masked_positions": predictions, "masked_ids": predictions}

    def prepare(self, example):
        tokens = example["inputs"] if "inputs" in example else example["tokens"]
        inputs, cut = trim(tokens, self.lengths["inputs"])
        if len(inputs) == 0:
            raise SkipExample("empty")
        types = example.get("token_type_ids")
        types = np.zeros(len(inputs), np.int32) if types is None else trim(types, len(inputs))[0]
        positions = np.asarray(example.get("masked_positions", ()), np.int32)
        ids = np.asarray(example.get("masked_ids", ()), np.int32)
        weights = np.asarray(example.get("masked_weights", np.ones(len(positions))), np.float32)
        keep = (weights > 0) & (positions < len(inputs))
        positions, cut_p = trim(positions[keep], self.lengths["max_predictions"])
        ids = ids[keep][:len(positions)]
        out = {"inputs": inputs, "token_type_ids": types, "masked_positions": positions,
               "masked_ids": ids}
        if self.nsp:
            out["next_sentence_label"] = int(example.get("next_sentence_label", 0))
        return out, cut + cut_p

    def finalize(self, rows):
        seg = rows["inputs_segment_ids"]
        batch, length = seg.shape
        # Start of segment s in its row = number of tokens in segments 1..s-1.
        counts = np.zeros((batch, length + 2), np.int32)
        np.add.at(counts, (np.arange(batch)[:, None], seg), 1)
        counts[:, 0] = 0
        starts = np.cumsum(counts, axis=1) - counts  # [batch, segments]
        mseg = rows["masked_positions_segment_ids"]  # [batch, max_predictions]
        offsets = np.take_along_axis(starts, mseg, axis=1)
        real = mseg > 0
        out = {
            "encoder_input_tokens": rows["inputs"],  # [batch, length]
            "token_type_ids": rows["token_type_ids"],
            "encoder_segment_ids": seg,
            "encoder_positions": rows["inputs_positions"],
            "masked_positions": np.where(real, rows["masked_positions"] + offsets,
                                         0).astype(np.int32),
            "masked_ids": np.where(real, rows["masked_ids"], 0).astype(np.int32),
            "masked_weights": real.astype(np.float32),  # [batch, max_predictions]
        }
        if self.nsp:
            out["next_sentence_labels"] = rows["next_sentence_label"].astype(np.int32)  # [batch]
        return out
