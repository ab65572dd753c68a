"""The evaluator with fake models (perfect and fixed wrong answers, hand-computed scores), a
real tiny T5 through `predict`, encoder classifiers, and the results files."""
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.data import finetune_tasks as B
from t2t.data import bundled
from t2t.data.converters import EncDecConverter
from t2t.data.sources import ListSource
from t2t.data.vocab import SentencePieceVocabulary, WordPieceVocabulary
from t2t.evaluation import metrics
from t2t.train import evaluator

LABELS = ("ham", "spam")
MAIL = [("Lunch at noon?", 0), ("Minutes attached.", 0), ("Win a prize now!", 1),
        ("The build is fixed.", 0), ("Cheap pills, buy now.", 1)]
VERSES = [(r["text"], s["text"]) for r, s in bundled.aligned("web", "rv1909")[:6]]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    texts = [r["text"] for r in bundled.load("web")[:300]]
    return SentencePieceVocabulary.train(texts, tmp_path_factory.mktemp("spm") / "tiny", 500,
                                         extra_ids=10)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    from tokenizers import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=True)
    tokenizer.train_from_iterator([t for t, _ in MAIL] * 3, vocab_size=200, show_progress=False)
    path = tmp_path_factory.mktemp("wp") / "vocab.txt"
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    path.write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
    return WordPieceVocabulary(path)


def spam_task(vocabulary):
    def fmt(record):
        return {"inputs": f"spam text: {record['text']}", "targets": LABELS[record["label"]],
                "label": record["label"]}

    records = [{"text": t, "label": label} for t, label in MAIL]
    return B.FinetuneTask(
        "tiny_spam", lambda split: ListSource(records), [fmt, B.tokenize_text_to_text],
        vocabulary, (B.f1_with_invalid, metrics.accuracy), label_names=LABELS,
        encoder_pair_fn=lambda r: (r["text"], None, r["label"]))


def translation_task(vocabulary):
    records = [{"en": en, "es": es} for en, es in VERSES]
    return B.FinetuneTask(
        "tiny_en_es", lambda split: ListSource(records),
        [lambda r: B.translate_format(r, source="en", target="es"), B.tokenize_text_to_text],
        vocabulary, (metrics.bleu,))


class FakeT5:
    """``predict`` answers the targets (``answer=None``) or one fixed token sequence."""

    family = "t5"

    def __init__(self, answer=None):
        self.answer, self.calls = answer, []

    def predict(self, params, batch, *, max_decode_length, **options):
        self.calls.append((batch["encoder_input_tokens"].shape, max_decode_length, options))
        rows = len(batch["encoder_input_tokens"])
        if self.answer is None:
            out = batch["decoder_target_tokens"]
        else:
            out = np.tile(np.asarray(self.answer, np.int32), (rows, 1))
        out = out[:, :max_decode_length]
        return np.pad(out, [(0, 0), (0, max_decode_length - out.shape[1])])


def test_perfect_predictions_score_100(spm):
    model = FakeT5()
    scores = evaluator.evaluate(model, None, spam_task(spm), "validation", vocabulary=spm,
                                batch_size=2)
    assert scores == {"f1": 100.0, "accuracy": 100.0}
    assert [c[0][0] for c in model.calls] == [2, 2, 2]  # 5 examples, the last batch padded
    bleu = evaluator.evaluate(FakeT5(), None, translation_task(spm), "test", vocabulary=spm,
                              batch_size=4)
    assert bleu == {"bleu": pytest.approx(100.0)}


def test_fixed_wrong_answers_hand_computed(spm):
    task = spam_task(spm)
    always_spam = FakeT5(spm.encode("spam") + [spm.eos_id])
    # 2 of 5 right; spam precision 2/5, recall 1 -> F1 = 2 * 0.4 / 1.4.
    assert evaluator.evaluate(always_spam, None, task, "test", vocabulary=spm,
                              batch_size=4) == pytest.approx(
        {"f1": 100 * 0.8 / 1.4, "accuracy": 40.0})
    # An answer that is no label is wrong for every example (T5's -1).
    unknown = FakeT5(spm.encode("maybe") + [spm.eos_id])
    assert evaluator.evaluate(unknown, None, task, "test", vocabulary=spm,
                              batch_size=8) == {"f1": 0.0, "accuracy": 0.0}
    # max_examples=4 spreads over the 5: records 0-3 (ham, ham, spam, ham) -> precision 1/4,
    # recall 1: F1 40.
    assert evaluator.evaluate(always_spam, None, task, "test", vocabulary=spm, batch_size=8,
                              max_examples=4) == pytest.approx({"f1": 40.0, "accuracy": 25.0})


def test_lengths_and_decode_options_reach_predict(spm):
    task = spam_task(spm)
    model = FakeT5()
    evaluator.evaluate(model, None, task, "test", vocabulary=spm, batch_size=8,
                       strategy="beam", beam_size=2)
    examples = task.examples("test")
    (shape, length, options), = model.calls
    assert shape == (8, max(len(ex["inputs"]) for ex in examples))
    assert length == max(len(ex["targets"]) for ex in examples)
    assert options == {"strategy": "beam", "beam_size": 2}
    evaluator.evaluate(model, None, task, "test", batch_size=8, max_decode_length=3,
                       sequence_length={"inputs": 6})
    assert model.calls[-1][:2] == ((8, 6), 3)


class FakeGPT:
    """A decoder-only model: answers the target of each prompt ([0, inputs...])."""

    family = "gpt"

    def __init__(self, answers):
        self.answers, self.prefix_lm = answers, []

    def predict(self, params, batch, *, max_decode_length, prompt_lengths=None, **options):
        causal = batch.get("decoder_causal_attention")
        self.prefix_lm.append(causal is not None)
        lengths = causal.sum(1) if prompt_lengths is None else prompt_lengths
        out = np.zeros((len(batch["decoder_input_tokens"]), max_decode_length), np.int32)
        for row, (tokens, n) in enumerate(zip(batch["decoder_input_tokens"], lengths)):
            answer = self.answers.get(tuple(tokens[:n]), [])
            out[row, :len(answer)] = answer
        return out


def test_decoder_only_models_continue_the_prompt(spm):
    task = spam_task(spm)
    model = FakeGPT({(0, *ex["inputs"]): ex["targets"] for ex in task.examples("test")})
    assert evaluator.evaluate(model, None, task, "test", vocabulary=spm,
                              batch_size=2) == {"f1": 100.0, "accuracy": 100.0}
    assert evaluator.evaluate(model, None, task, "test", vocabulary=spm, batch_size=8,
                              prefix_lm=False) == {"f1": 100.0, "accuracy": 100.0}
    assert model.prefix_lm == [True, True, True, False]


class FakeClassifier:
    """An encoder classifier: looks each row's tokens up (``table``) or answers ``label``."""

    family = "bert"

    def __init__(self, table=None, label=0):
        table = table or {(): label}
        width = max(len(row) for row in table)
        self.rows = jnp.asarray([list(row) + [-1] * (width - len(row)) for row in table])
        self.labels, self.label = jnp.asarray(list(table.values())), label

    def predict(self, params, batch, **_):
        """Traceable (the evaluator jits it): the label of the table row equal to each row."""
        assert set(batch) == {"encoder_input_tokens", "encoder_segment_ids", "token_type_ids"}
        tokens = batch["encoder_input_tokens"]                               # [b, l]
        if tokens.shape[1] != self.rows.shape[1]:
            return jnp.full(tokens.shape[:1], self.label)
        equal = jnp.all(tokens[:, None, :] == self.rows[None], axis=-1)       # [b, rows]
        return jnp.where(equal.any(-1), self.labels[jnp.argmax(equal, -1)], self.label)


def test_encoder_classifiers_compare_labels(spm, wordpiece):
    task = spam_task(spm)
    features = B.classification_examples(task, "test", wordpiece, 16)
    table = {tuple(row): int(label)
             for row, label in zip(features["encoder_input_tokens"], features["label"])}
    assert evaluator.evaluate(FakeClassifier(table), None, task, "test", vocabulary=wordpiece,
                              batch_size=2, max_length=16) == {"f1": 100.0, "accuracy": 100.0}
    assert evaluator.evaluate(FakeClassifier(label=0), None, task, "test",
                              vocabulary=wordpiece, batch_size=4, max_length=16) == \
        {"f1": 0.0, "accuracy": 60.0}
    with pytest.raises(ValueError, match="WordPiece"):
        evaluator.evaluate(FakeClassifier(), None, task, "test")


def test_a_real_t5_runs_through_predict(spm):
    from t2t.models.t5 import EncoderDecoderModel
    from t2t.nn.config import TransformerConfig

    config = TransformerConfig(vocab_size=spm.padded_vocab_size, d_model=16, num_heads=2,
                               head_dim=8, d_ff=32, num_encoder_layers=1,
                               num_decoder_layers=1, dropout_rate=0.0)
    model = EncoderDecoderModel(config)
    task = spam_task(spm)
    examples = task.examples("test")
    batch = EncDecConverter({"inputs": 16, "targets": 4}, pack=False)(examples[:2])
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), batch))
    texts = evaluator.predict_texts(model, params, examples, spm, batch_size=4,
                                    sequence_length={"inputs": 16, "targets": 4})
    assert len(texts) == 5 and all(isinstance(t, str) for t in texts)
    scores = evaluator.compute_metrics(task, examples, texts)
    assert set(scores) == {"f1", "accuracy"} and 0.0 <= scores["accuracy"] <= 100.0


def test_unlabelled_task_is_refused(spm):
    with pytest.raises(ValueError, match="no metrics"):
        evaluator.evaluate(FakeT5(), None, B.FinetuneTask("bare", lambda s: ListSource([]), []),
                           "train", batch_size=1)


def test_write_results(tmp_path):
    results = {"glue_cola": {"matthews_corrcoef": 41.234},
               "glue_mrpc": {"f1": 88.0, "accuracy": 83.456},
               "wmt14_ende": {"bleu": 26.98}}
    json_path, md_path = evaluator.write_results(results, tmp_path / "eval")
    assert json.loads(json_path.read_text()) == results
    assert md_path.read_text() == (
        "| task | matthews_corrcoef | f1 | accuracy | bleu |\n"
        "|---|---:|---:|---:|---:|\n"
        "| glue_cola | 41.23 | - | - | - |\n"
        "| glue_mrpc | - | 88.00 | 83.46 | - |\n"
        "| wmt14_ende | - | - | - | 26.98 |\n")
