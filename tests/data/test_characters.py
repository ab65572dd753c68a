"""ELMo's word tokens and character ids (t2t.data.characters)."""
import numpy as np
import pytest

from t2t.data import characters as ch
from t2t.errors import UserError


def test_tokenize_keeps_case_inner_apostrophes_and_punctuation():
    assert ch.tokenize("In the beginning, God's Word: \"Let there be light.\"") == [
        "In", "the", "beginning", ",", "God's", "Word", ":", '"', "Let", "there", "be",
        "light", ".", '"']


def test_char_ids_are_bilm_tf_ids_plus_one():
    ids = ch.char_ids("Né", max_chars=8)
    # BOW, the UTF-8 bytes (N, 0xC3, 0xA9) + 1, EOW, then padding; bilm-tf's 258/259/260 + 1
    assert ids.tolist() == [259, ord("N") + 1, 0xC3 + 1, 0xA9 + 1, 260, 261, 261, 261]
    assert ch.char_ids("<S>", 5).tolist() == [259, 257, 260, 261, 261]
    assert ch.char_ids("</S>", 5).tolist() == [259, 258, 260, 261, 261]
    long = ch.char_ids("x" * 100)
    assert long.shape == (ch.MAX_CHARS,) and long[-1] == ch.EOW_CHAR
    assert (long[1:-1] == ord("x") + 1).all() and long.max() < ch.NUM_CHAR_IDS
    with pytest.raises(UserError, match="max_chars"):
        ch.char_ids("a", max_chars=2)


def test_word_vocabulary_counts_and_unknowns():
    vocab = ch.WordVocabulary.from_texts(["a b a c", "a b d"], size=6)
    assert vocab.words == ["<pad>", "<S>", "</S>", "<UNK>", "a", "b"]
    assert vocab.encode(["b", "c", "a"]) == [5, ch.UNK, 4]
    assert vocab.decode([4, 3]) == ["a", "<UNK>"]
    with pytest.raises(UserError, match="size"):
        ch.WordVocabulary.from_texts(["a"], size=4)


def test_sentence_features_wrap_sentences_and_pad():
    vocab = ch.WordVocabulary(["In", "the", "beginning"])
    f = ch.sentence_features([["In", "the", "beginning"], ["the", "end", "of", "it"]], vocab,
                             max_length=5, max_chars=6)
    assert f["token_ids"].tolist() == [[1, 4, 5, 6, 2], [1, 5, 3, 3, 2]]   # truncated, </S>
    assert f["char_ids"].shape == (2, 5, 6)
    np.testing.assert_array_equal(f["char_ids"][0, 0], ch.char_ids("<S>", 6))
    np.testing.assert_array_equal(f["char_ids"][1, 2], ch.char_ids("end", 6))
    short = ch.sentence_features([["In"]], vocab, max_length=5, max_chars=6)
    assert short["token_ids"].tolist() == [[1, 4, 2, 0, 0]]
    assert not short["char_ids"][0, 3:].any()                             # no token, no chars


def test_converter_truncates_keeping_the_closing_token_and_its_characters():
    vocab = ch.WordVocabulary(["a", "b"])
    example = ch.text_example(["a", "zebra", "b", "a", "b"], vocab, max_length=20, max_chars=7)
    converter = ch.ElmoConverter({"tokens": 4, "characters": 7})
    packable, cut = converter.prepare(example)
    assert cut == 3
    batch = converter.finalize(_rows(converter, [packable]))
    assert batch["token_ids"].tolist() == [[1, 4, ch.UNK, 2], [0, 0, 0, 0]]
    np.testing.assert_array_equal(batch["char_ids"][0, 2], ch.char_ids("zebra", 7))  # OOV
    np.testing.assert_array_equal(batch["char_ids"][0, 3], ch.char_ids("</S>", 7))
    assert converter.empty_batch(3)["char_ids"].shape == (3, 4, 7)
    with pytest.raises(UserError, match="max_chars=7"):
        converter.prepare(ch.text_example(["a"], vocab, 4, max_chars=9))


def _rows(converter, packables):
    packer = converter.new_packer(2)
    for p in packables:
        assert packer.add(p)
    return packer.rows(2)
