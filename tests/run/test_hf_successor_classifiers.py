"""Hugging Face classifier directories of BERT's successors (tiny random
`RobertaForSequenceClassification` and `AlbertForSequenceClassification`, each with a
tokenizer trained here on Bible verses and saved by its transformers class) through the
command line on a sentence-pair CSV task: `t2t eval` scores the directory with its own
tokenizer (predictions = transformers' argmax on the rows AutoTokenizer builds: RoBERTa's
`<s> a </s></s> b </s>`, ALBERT's `[CLS] a [SEP] b [SEP]` with token types), and `t2t
finetune`'s first loss is transformers' cross entropy on those rows."""

import pytest
import sentencepiece
import torch
import transformers as t

from tests.run.helpers import (LABELS, LENGTH, TRAIN, check_eval_and_finetune,
                               byte_bpe_tokenizer, hf_pair_logits, save_classifier,
                               write_pair_task)
from tests.convert.helpers import BERTISH, perturb
from tests.data.helpers import verses
from tests.run.test_hf_classifier import FAST

@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """train/test CSVs of sentence pairs (short enough that no row is cut), the verses
    to train tokenizers on, and the command's flags."""
    root = tmp_path_factory.mktemp("hf_successors")
    lines = verses(1000)
    rows, flags = write_pair_task(root, FAST)
    return root, rows, lines, flags


def _roberta(path, lines):
    tokenizer = byte_bpe_tokenizer(path, lines, t.RobertaTokenizerFast)
    config = t.RobertaConfig(vocab_size=len(tokenizer), type_vocab_size=1, pad_token_id=1,
                             **dict(BERTISH, max_position_embeddings=LENGTH + 2))
    return tokenizer, config, t.RobertaForSequenceClassification


def _albert(path, lines):
    prefix = path.parent / f"{path.name}_spiece"
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(prefix), vocab_size=600, bos_id=-1,
        eos_id=-1, pad_id=0, unk_id=1, control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        minloglevel=2, num_threads=1)
    tokenizer = t.AlbertTokenizerFast(vocab_file=f"{prefix}.model")
    config = t.AlbertConfig(vocab_size=len(tokenizer), embedding_size=16,
                            classifier_dropout_prob=0.0, **dict(BERTISH,
                                                               max_position_embeddings=LENGTH))
    return tokenizer, config, t.AlbertForSequenceClassification


@pytest.fixture(scope="module", params=[_roberta, _albert], ids=["roberta", "albert"])
def hf_dir(request, task, tmp_path_factory):
    """A tiny random classifier (no dropout) with its tokenizer, as save_pretrained writes
    them; the directory, the model and AutoTokenizer read back from it."""
    path = tmp_path_factory.mktemp("hf") / "classifier"
    tokenizer, config, cls = request.param(path, task[2])
    torch.manual_seed(0)
    config.num_labels = len(LABELS)
    model = cls(config).eval()
    perturb(model, 0.3)
    output = getattr(model.classifier, "out_proj", model.classifier)
    tokenizer = save_classifier(path, model, tokenizer, output, task[1][TRAIN:])
    return path, model, tokenizer


def test_eval_scores_it_with_its_tokenizer_and_finetune_continues_from_its_head(
        task, hf_dir, tmp_path):
    root, rows, _, flags = task
    path, model, tokenizer = hf_dir
    flags = [*flags, f"--gin.INITIAL_CHECKPOINT={path}"]

    train, test = rows[:TRAIN], rows[TRAIN:]
    argmax = check_eval_and_finetune(flags, tmp_path, LABELS, [r[2] for r in test],
                                     hf_pair_logits(model, tokenizer, test), [r[2] for r in train],
                                     hf_pair_logits(model, tokenizer, train))
    assert set(argmax) == {0, 1}        # both labels predicted: the comparison says something


def test_rows_are_the_ones_autotokenizer_builds(hf_dir, task):
    """`row_layout` of the directory's tokenizer puts the special tokens and token types
    where transformers' tokenizer(a, b) and tokenizer(a) put them."""
    from t2t.data import hf_tokenizer
    path, _, tokenizer = hf_dir
    vocabulary = hf_tokenizer.load(path)
    layout = hf_tokenizer.row_layout(vocabulary)
    for a, b, _ in task[1][:4]:
        ids = [vocabulary.encode(text, add_special_tokens=False) for text in (a, b)]
        pair = tokenizer(a, b, return_token_type_ids=True)
        assert layout.build(*ids) == (pair["input_ids"], pair["token_type_ids"])
        single = tokenizer(a, return_token_type_ids=True)
        assert layout.build(ids[0]) == (single["input_ids"], single["token_type_ids"])
        assert layout.added(True) == len(pair["input_ids"]) - sum(map(len, ids))


def test_a_family_whose_rows_are_its_own_is_refused_in_one_line(tmp_path):
    """XLNet's heads over an HF directory, or an HF GPT-2 under BERT's heads: one line."""
    from t2t.errors import ConfigError
    from t2t.run.classifier_experiments import bert_trunk
    for name, config in (("roberta", t.RobertaConfig()), ("gpt2", t.GPT2Config())):
        config.save_pretrained(tmp_path / name)
    with pytest.raises(ConfigError, match="is a Hugging Face RoBERTa directory: XLNet "
                                          "fine-tuning starts from a t2t XLNet MODEL_DIR"):
        bert_trunk(str(tmp_path / "roberta"), None, True, family="xlnet")
    with pytest.raises(ConfigError, match="is a Hugging Face GPT-2 directory: GPT-2 "
                                          "fine-tuning starts from a t2t GPT-2 MODEL_DIR"):
        bert_trunk(str(tmp_path / "gpt2"), None, True)


def test_choice_and_span_rows_are_the_ones_autotokenizer_builds(hf_dir, task):
    """Multiple choice's (context, ending) rows and span QA's (question, window) rows are
    tokenizer(a, b)'s, padded; the answer's token span covers the answer's text."""
    from t2t.data import hf_tokenizer, multiple_choice, span_qa
    path, _, tokenizer = hf_dir
    vocabulary = hf_tokenizer.load(path)
    pairs = task[1][:3]

    def padded(a, b):
        out = tokenizer(a, b, return_token_type_ids=True, padding="max_length",
                        max_length=LENGTH)
        return out["input_ids"], out["token_type_ids"]

    choices = multiple_choice.choice_features(
        [{"context": a, "endings": [b, a], "label": 0} for a, b, _ in pairs], vocabulary,
        LENGTH)
    for row, (a, b, _) in enumerate(pairs):
        for choice, ending in enumerate((b, a)):
            ids, types = padded(a, ending)
            assert choices["encoder_input_tokens"][row, choice].tolist() == ids
            assert choices["token_type_ids"][row, choice].tolist() == types

    answer = pairs[0][1].split()[1]
    records = [{"question": a, "context": b, "answers": {
        "text": [answer], "answer_start": [b.index(answer)]}} for a, b, _ in pairs[:1]]
    spans = span_qa.span_features(records, vocabulary, max_length=LENGTH, doc_stride=LENGTH)
    ids, types = padded(pairs[0][0], pairs[0][1])
    assert spans.features["encoder_input_tokens"][0].tolist() == ids
    assert spans.features["token_type_ids"][0].tolist() == types
    start, end = spans.features["start_positions"][0], spans.features["end_positions"][0]
    assert tokenizer.decode(ids[start:end + 1]).strip() == answer
