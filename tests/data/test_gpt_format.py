"""GPT-1's input transformations (Radford et al. 2018, Figure 1): exact token layouts,
extract positions, truncation and the one-line errors."""
import numpy as np
import pytest

from t2t.data.gpt_format import SpecialTokens, example_rows, format_features, num_rows, row
from t2t.errors import UserError

S = SpecialTokens.after(100)           # start 100, delimiter 101, extract 102
A, B, C = [5, 6, 7], [8, 9], [10]


def test_special_tokens_follow_the_vocabulary():
    assert (S.start, S.delimiter, S.extract) == (100, 101, 102)


def test_layouts_are_figure_1():
    assert example_rows("classification", A, None, S, 16) == [[100, 5, 6, 7, 102]]
    assert example_rows("entailment", A, B, S, 16) == [[100, 5, 6, 7, 101, 8, 9, 102]]
    assert example_rows("similarity", A, B, S, 16) == [[100, 5, 6, 7, 101, 8, 9, 102],
                                                       [100, 8, 9, 101, 5, 6, 7, 102]]
    assert example_rows("multiple_choice", A, [B, C], S, 16) == [
        [100, 5, 6, 7, 101, 8, 9, 102], [100, 5, 6, 7, 101, 10, 102]]
    assert [num_rows(f, 3) for f in ("classification", "entailment", "similarity",
                                     "multiple_choice")] == [1, 1, 2, 3]


def test_features_pad_and_point_at_the_extract_token():
    f = format_features("multiple_choice", [(A, [B, C], 1), (C, [A, B], 0)], S, 10, pad_id=0)
    assert f["decoder_input_tokens"].shape == (2, 2, 10) and f["label"].tolist() == [1, 0]
    np.testing.assert_array_equal(f["decoder_input_tokens"][0, 1],
                                  [100, 5, 6, 7, 101, 10, 102, 0, 0, 0])
    np.testing.assert_array_equal(f["decoder_segment_ids"][0, 1], [1] * 7 + [0] * 3)
    tokens, ends = f["decoder_input_tokens"], f["extract_positions"]
    assert ends.tolist() == [[7, 6], [6, 5]]
    assert (np.take_along_axis(tokens, ends[..., None], axis=2) == S.extract).all()
    assert f["decoder_segment_ids"].sum(-1).tolist() == (ends + 1).tolist()


def test_truncation_is_longest_first_and_keeps_the_specials():
    long_a, long_b = list(range(10, 30)), list(range(40, 44))
    # budget 12 - 3 specials = 9: b keeps its 4 tokens, a is cut to 5
    assert row(long_a, long_b, S, 12) == [100, 10, 11, 12, 13, 14, 101, 40, 41, 42, 43, 102]
    assert row(long_a, list(range(40, 60)), S, 9) == [100, 10, 11, 12, 101, 40, 41, 42, 102]
    assert row(long_a, None, S, 5) == [100, 10, 11, 12, 102]


def test_bad_input_is_one_line():
    with pytest.raises(UserError, match="max_length 4 cannot hold"):
        row(A, B, S, 4)
    with pytest.raises(UserError, match="max_length 2 cannot hold"):
        row(A, None, S, 2)
    with pytest.raises(UserError, match="choose one of"):
        example_rows("translation", A, B, S, 16)
    with pytest.raises(UserError, match="needs a second text"):
        example_rows("entailment", A, None, S, 16)
    with pytest.raises(UserError, match="same number"):
        format_features("multiple_choice", [(A, [B, C], 0), (A, [B], 0)], S, 16)
