"""Feature converters: seqio's documented examples, exactly, plus BERT features."""
import numpy as np
import pytest

from t2t.data.converters import (EncDecConverter, EncoderConverter, LMConverter,
                                 PrefixLMConverter, shift_right)
from t2t.data.preprocessors import SkipExample

TWO = [{"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
       {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]}]


def as_lists(batch):
    return {k: v.tolist() for k, v in batch.items()}


def test_encdec_packed_matches_seqio():
    out = EncDecConverter({"inputs": 10, "targets": 7})(TWO)
    assert as_lists(out) == {
        "encoder_input_tokens": [[7, 8, 5, 1, 8, 4, 9, 3, 1, 0]],
        "encoder_segment_ids": [[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]],
        "encoder_positions": [[0, 1, 2, 3, 0, 1, 2, 3, 4, 0]],
        "decoder_target_tokens": [[3, 9, 1, 4, 1, 0, 0]],
        "decoder_input_tokens": [[0, 3, 9, 0, 4, 0, 0]],
        "decoder_loss_weights": [[1, 1, 1, 1, 1, 0, 0]],
        "decoder_segment_ids": [[1, 1, 1, 2, 2, 0, 0]],
        "decoder_positions": [[0, 1, 2, 0, 1, 0, 0]],
    }
    assert out["decoder_loss_weights"].dtype == np.float32
    assert all(v.dtype == np.int32 for k, v in out.items() if k != "decoder_loss_weights")


def test_encdec_unpacked_pads_each_example():
    out = EncDecConverter({"inputs": 6, "targets": 4}, pack=False)(TWO)
    assert out["encoder_input_tokens"].tolist() == [[7, 8, 5, 1, 0, 0], [8, 4, 9, 3, 1, 0]]
    assert out["decoder_input_tokens"].tolist() == [[0, 3, 9, 0], [0, 4, 0, 0]]
    assert out["decoder_segment_ids"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]


def test_lm_packed_matches_seqio():
    out = LMConverter({"targets": 6})([{"targets": [3, 9, 1]}, {"targets": [4, 1]}])
    assert as_lists(out) == {
        "decoder_target_tokens": [[3, 9, 1, 4, 1, 0]],
        "decoder_input_tokens": [[0, 3, 9, 0, 4, 0]],
        "decoder_loss_weights": [[1, 1, 1, 1, 1, 0]],
        "decoder_positions": [[0, 1, 2, 0, 1, 0]],
        "decoder_segment_ids": [[1, 1, 1, 2, 2, 0]],
    }


def test_prefix_lm_packed_matches_seqio():
    out = PrefixLMConverter({"inputs": 7, "targets": 8})(TWO)
    assert as_lists(out) == {
        "decoder_target_tokens": [[7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0]],
        "decoder_input_tokens": [[0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0]],
        "decoder_loss_weights": [[0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0]],
        "decoder_positions": [[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0]],
        "decoder_segment_ids": [[1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 0]],
        # inputs plus the first target position (t5x/mesh-tf convention)
        "decoder_causal_attention": [[1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]],
    }


def test_prefix_lm_unpacked_matches_seqio():
    out = PrefixLMConverter({"inputs": 10, "targets": 4}, pack=False)(
        [{"inputs": [9, 4, 6, 1], "targets": [3, 9, 1]}])
    assert out["decoder_target_tokens"].tolist() == [[9, 4, 6, 1, 3, 9, 1] + [0] * 7]
    assert out["decoder_loss_weights"].tolist() == [[0, 0, 0, 0, 1, 1, 1] + [0] * 7]
    assert out["decoder_causal_attention"].tolist() == [[1, 1, 1, 1, 1] + [0] * 9]
    # seqio shifts an unpacked row as a whole and leaves the last target at a padding
    # position (loss weight 0); we zero all padding.
    assert out["decoder_input_tokens"].tolist() == [[0, 9, 4, 6, 1, 3, 9] + [0] * 7]
    full = PrefixLMConverter({"inputs": 10, "targets": 4}, pack=False, loss_on_targets_only=False)
    assert full([{"inputs": [9, 4], "targets": [3]}])["decoder_loss_weights"].tolist() == \
        [[1, 1, 1] + [0] * 11]


def test_truncation_is_counted_and_keeps_the_front():
    conv = EncDecConverter({"inputs": 3, "targets": 2})
    packable, cut = conv.prepare({"inputs": [1, 2, 3, 4, 5], "targets": [6, 7, 8]})
    assert packable["inputs"].tolist() == [1, 2, 3] and packable["targets"].tolist() == [6, 7]
    assert cut == 3
    with pytest.raises(SkipExample):
        conv.prepare({"inputs": [1], "targets": []})


def test_no_token_crosses_a_segment():
    rng = np.random.default_rng(1)
    examples = [{"inputs": rng.integers(3, 50, rng.integers(1, 12)),
                 "targets": rng.integers(3, 50, rng.integers(1, 6))} for _ in range(60)]
    out = EncDecConverter({"inputs": 24, "targets": 12})(examples)
    rebuilt = []
    for b in range(len(out["encoder_input_tokens"])):
        for s in range(1, out["encoder_segment_ids"][b].max() + 1):
            enc = out["encoder_input_tokens"][b][out["encoder_segment_ids"][b] == s]
            dec = out["decoder_segment_ids"][b] == s
            tgt, inp = out["decoder_target_tokens"][b][dec], out["decoder_input_tokens"][b][dec]
            assert inp.tolist() == [0] + tgt[:-1].tolist()  # shift stays inside the segment
            rebuilt.append((enc.tolist(), tgt.tolist()))
    expected = [(e["inputs"].tolist(), e["targets"].tolist()) for e in examples]
    assert sorted(rebuilt) == sorted(expected)


def test_shift_right_per_segment():
    tokens = np.array([[5, 6, 7, 8, 9, 0]])
    seg = np.array([[1, 1, 2, 2, 2, 0]])
    pos = np.array([[0, 1, 0, 1, 2, 0]])
    assert shift_right(tokens, pos, seg).tolist() == [[0, 5, 0, 7, 8, 0]]


def bert_example(tokens, positions, label=None, types=None):
    n = len(positions)
    out = {"inputs": tokens, "masked_positions": positions + [0] * (3 - n),
           "masked_ids": [100 + p for p in positions] + [0] * (3 - n),
           "masked_weights": [1.0] * n + [0.0] * (3 - n)}
    if label is not None:
        out["next_sentence_label"] = label
    if types is not None:
        out["token_type_ids"] = types
    return out


def test_encoder_unpacked_with_nsp():
    conv = EncoderConverter({"inputs": 6, "max_predictions": 3})
    out = conv([bert_example([2, 5, 4, 3, 6, 3], [1, 4], 1, [0, 0, 0, 0, 1, 1]),
                bert_example([2, 7, 3], [1], 0)])
    assert as_lists(out) == {
        "encoder_input_tokens": [[2, 5, 4, 3, 6, 3], [2, 7, 3, 0, 0, 0]],
        "token_type_ids": [[0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0]],
        "encoder_segment_ids": [[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]],
        "encoder_positions": [[0, 1, 2, 3, 4, 5], [0, 1, 2, 0, 0, 0]],
        "masked_positions": [[1, 4, 0], [1, 0, 0]],
        "masked_ids": [[101, 104, 0], [101, 0, 0]],
        "masked_weights": [[1, 1, 0], [1, 0, 0]],
        "next_sentence_labels": [1, 0],
    }


def test_encoder_packed_offsets_masked_positions():
    conv = EncoderConverter({"inputs": 8, "max_predictions": 3}, pack=True, nsp=False)
    out = conv([bert_example([2, 5, 3], [1]), bert_example([2, 6, 7, 3], [1, 2]),
                bert_example([2, 9, 9, 9, 9, 3], [4, 5])])  # does not fit row 0: row 1
    assert out["encoder_input_tokens"].tolist() == [[2, 5, 3, 2, 6, 7, 3, 0],
                                                    [2, 9, 9, 9, 9, 3, 0, 0]]
    assert out["masked_positions"].tolist() == [[1, 4, 5], [4, 5, 0]]
    assert out["masked_ids"].tolist() == [[101, 101, 102], [104, 105, 0]]
    assert out["masked_weights"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert np.all(out["encoder_input_tokens"][0][out["masked_positions"][0]] != 3)
    assert "next_sentence_labels" not in out
    with pytest.raises(ValueError, match="MLM only"):
        EncoderConverter({"inputs": 8, "max_predictions": 3}, pack=True)


def test_encoder_drops_predictions_past_truncation():
    conv = EncoderConverter({"inputs": 4, "max_predictions": 3})
    packable, cut = conv.prepare(bert_example([2, 5, 6, 7, 8, 3], [1, 4, 5]))
    assert packable["masked_positions"].tolist() == [1] and cut == 2


def test_empty_batch_shapes():
    spec = {k: (v.shape, v.dtype) for k, v in
            EncDecConverter({"inputs": 8, "targets": 4}).empty_batch(2).items()}
    assert spec["encoder_input_tokens"] == ((2, 8), np.int32)
    assert spec["decoder_loss_weights"] == ((2, 4), np.float32)
    out = EncoderConverter({"inputs": 8, "max_predictions": 3}).empty_batch(2)
    assert out["next_sentence_labels"].shape == (2,) and out["masked_weights"].shape == (2, 3)


def test_prefix_lm_trims_the_concatenation_but_keeps_targets():
    conv = PrefixLMConverter({"inputs": 4, "targets": 4})
    packable, cut = conv.prepare({"inputs": [1, 2, 3, 4, 5, 6], "targets": [7, 8, 9]})
    assert packable["targets"].tolist() == [1, 2, 3, 4, 5, 7, 8, 9] and cut == 1
    assert packable["inputs_width"].tolist() == [5] * 8
    # A short prefix leaves its room to long targets (seqio's trimming) ...
    packable, cut = conv.prepare({"inputs": [1, 2], "targets": list(range(10, 17))})
    assert packable["targets"].tolist() == [1, 2, *range(10, 16)] and cut == 1
    # ... but an over-long prefix is cut so that the targets (up to 4) still fit.
    packable, cut = conv.prepare({"inputs": list(range(1, 20)), "targets": [30, 31]})
    assert packable["targets"].tolist() == [1, 2, 3, 4, 5, 6, 30, 31] and cut == 13
    assert packable["inputs_width"].tolist() == [6] * 8
    packable, _ = conv.prepare({"inputs": list(range(1, 20)), "targets": list(range(30, 40))})
    assert packable["targets"].tolist() == [1, 2, 3, 4, 30, 31, 32, 33]
