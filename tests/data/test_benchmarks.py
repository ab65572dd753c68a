"""Standard benchmark tasks end to end on ``tfds.testing.mock_data`` (no TensorFlow):
TFDS source -> T5 preprocessing -> feature converter batch -> metrics, plus T5's formats on
hand-written records and the BERT encoder features."""
import itertools
import logging

import numpy as np
import pytest

from t2t.data import finetune_tasks as B
from t2t.data.catalog import downstream as D
from t2t.data import bundled
from t2t.data.converters import EncDecConverter
from t2t.data.tasks import get_task, remove_task
from t2t.train.evaluator import compute_metrics

tfds = pytest.importorskip("tensorflow_datasets")
logging.getLogger("absl").setLevel(logging.ERROR)  # "no dataset_info.json" for every mock


from tests.data.helpers import verses as _verses


@pytest.fixture
def tasks(spm):
    """Fresh tasks per test: a task keeps the sources it made (each under its own mock)."""
    return {t.name: t for t in D.benchmark_tasks(spm)}


# What each task's inputs start with (T5's text formats).
PREFIXES = {
    "glue_cola": "cola sentence: ", "glue_sst2": "sst2 sentence: ",
    "glue_mrpc": "mrpc sentence1: ", "glue_qqp": "qqp question1: ",
    "glue_stsb": "stsb sentence1: ", "glue_mnli": "mnli hypothesis: ",
    "glue_mnli_matched": "mnli hypothesis: ", "glue_mnli_mismatched": "mnli hypothesis: ",
    "glue_qnli": "qnli question: ", "glue_rte": "rte sentence1: ",
    "glue_wnli": "wnli sentence1: ", "glue_ax": "mnli hypothesis: ",
    "super_glue_boolq": "boolq passage: ", "super_glue_cb": "cb hypothesis: ",
    "super_glue_copa": "copa choice1: ", "super_glue_multirc": "multirc question: ",
    "super_glue_record": "record query: ", "super_glue_rte": "rte hypothesis: ",
    "super_glue_wic": "wic sentence1: ", "super_glue_wsc": "wsc text: ",
    "squad_v1_1": "question: ", "squad_v2_0": "question: ",
    "wmt14_ende": "translate English to German: ", "wmt14_enfr": "translate English to French: ",
    "wmt16_enro": "translate English to Romanian: ", "cnn_dailymail": "summarize: ",
}
GENERATION = ("wmt14_ende", "wmt14_enfr", "wmt16_enro", "cnn_dailymail")


def test_every_task_is_covered(tasks):
    assert set(tasks) == set(PREFIXES)


def test_label_names_match_tfds():
    import tensorflow_datasets.text.glue  # noqa: F401 - registers the builders
    import tensorflow_datasets.text.super_glue  # noqa: F401

    D._super_glue_without_tensorflow()
    for name, (_, _, labels, _) in D.GLUE.items():
        assert tuple(tfds.builder(f"glue/{name}").info.features["label"].names) == labels
    for name, (_, _, labels, _) in D.SUPER_GLUE.items():
        assert tuple(tfds.builder(f"super_glue/{name}").info.features["label"].names) == labels


def _split(task):
    return "validation" if "validation" in task.splits else task.splits[-1]


@pytest.mark.filterwarnings("ignore:An input array is constant")  # STS-B: all -1 when wrong
@pytest.mark.parametrize("name", sorted(PREFIXES))
def test_mock_data_end_to_end(name, tasks, spm):
    task = tasks[name]
    with tfds.testing.mock_data(num_examples=8):
        examples = task.examples(_split(task))
    assert len(examples) >= 8
    for ex in examples:
        assert ex["inputs_pretokenized"].startswith(PREFIXES[name])
        assert ex["inputs"].dtype == np.int32 and ex["inputs"][-1] == spm.eos_id
        assert spm.decode(ex["inputs"]) == ex["inputs_pretokenized"]
        assert spm.decode(ex["targets"]) == ex["targets_pretokenized"]
    batch = EncDecConverter({"inputs": 32, "targets": 8}, pack=False)(examples[:4])
    assert batch["encoder_input_tokens"].shape == (4, 32)
    assert batch["decoder_target_tokens"].shape == (4, 8)
    inside = batch["decoder_segment_ids"][:, 1:] > 0  # targets shifted right, start id 0
    np.testing.assert_array_equal(np.where(inside, batch["decoder_input_tokens"][:, 1:], 0),
                                  np.where(inside, batch["decoder_target_tokens"][:, :-1], 0))
    assert (batch["decoder_input_tokens"][:, 0] == 0).all()
    if not task.metric_fns or name in GENERATION:  # ax is unlabelled; n-grams: see below
        return
    scores = compute_metrics(task, examples, [ex["targets_pretokenized"] for ex in examples])
    assert scores and all(v == pytest.approx(100.0) for v in scores.values()), scores
    wrong = compute_metrics(task, examples, ["no such answer"] * len(examples))
    assert not any(np.isclose(v, 100.0) for v in wrong.values()), wrong


def _realistic_source(builder, split, *args, **kwargs):
    """``as_data_source`` stand-in: Bible verses in the builders' feature names."""
    web, rv = _verses(40), [r["text"] for r in bundled.load("rv1909")[:40]]
    if builder.name == "cnn_dailymail":
        return [{"article": " ".join(web[i:i + 5]), "highlights": web[i], "id": str(i),
                 "publisher": "cnn"} for i in range(0, 40, 5)]
    other = builder.builder_config.name.split("-")[0]
    return [{"en": e, other: r} for e, r in zip(web, rv)]


def test_generation_tasks_score_perfect_predictions(tasks):
    with tfds.testing.mock_data(as_data_source_fn=_realistic_source):
        for name in GENERATION:
            task = tasks[name]
            examples = task.examples("test")
            scores = compute_metrics(task, examples,
                                     [ex["targets_pretokenized"] for ex in examples])
            assert all(v == pytest.approx(100.0) for v in scores.values()), (name, scores)
    assert set(scores) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert examples[0]["inputs_pretokenized"] == "summarize: " + " ".join(_verses(5))


def test_split_mapping_and_unknown_split(tasks):
    seen = []

    def record_split(builder, split, *args, **kwargs):
        seen.append((builder.name, split))
        return [{"premise": "p", "hypothesis": "h", "label": 1, "idx": 0}]

    with tfds.testing.mock_data(as_data_source_fn=record_split):
        ex, = tasks["glue_mnli_mismatched"].examples("validation")
        ex2, = tasks["glue_mnli"].examples("validation_matched")
    assert seen == [("glue", "validation_mismatched"), ("glue", "validation_matched")]
    assert ex["inputs_pretokenized"] == "mnli hypothesis: h premise: p"
    assert ex["targets_pretokenized"] == "neutral" and ex["label"] == 1
    with pytest.raises(ValueError, match="has splits"):
        tasks["glue_mnli"].get_source("validation")
    assert tasks["glue_ax"].splits == ("test",)


def test_pipeline_batches_on_mock_data(tasks):
    with tfds.testing.mock_data(num_examples=6):
        for name in ("glue_mrpc", "squad_v1_1"):
            pipeline = tasks[name].get_pipeline(
                EncDecConverter({"inputs": 48, "targets": 12}), batch_size=4, seed=0,
                shuffle=False, num_epochs=1, process_index=0, process_count=1)
            batch = next(pipeline)
            assert batch["encoder_input_tokens"].shape == (4, 48)
            assert batch["decoder_target_tokens"].shape == (4, 12)
            assert (batch["encoder_segment_ids"] > 0).any()


def test_t5_text_formats():
    mnli = B.glue_format({"hypothesis": b"A cat.", "premise": np.array("A dog."),
                          "label": np.int64(2), "idx": 7}, benchmark="mnli",
                         feature_names=("hypothesis", "premise"), label_names=D.MNLI_LABELS)
    assert mnli == {"inputs": "mnli hypothesis: A cat. premise: A dog.",
                    "targets": "contradiction", "label": 2}
    unlabelled = B.glue_format({"sentence": "x", "label": -1}, benchmark="cola",
                               feature_names=("sentence",), label_names=("a", "b"))
    assert unlabelled["targets"] == "<unk>"
    multirc = B.glue_format(
        {"question": "q?", "answer": "a", "paragraph": "<b>Sent 1: </b>x<br>y", "label": 0,
         "idx": {"paragraph": 3, "question": 4, "answer": 5}}, benchmark="multirc",
        feature_names=("question", "answer", "paragraph"), label_names=("False", "True"))
    assert multirc["inputs"] == "multirc question: q? answer: a paragraph: Sent 1: x y"
    assert multirc["group"] == (3, 4)
    # STS-B: round(label * 5) / 5 with round-half-to-even (tf.round), one decimal.
    assert [B.stsb_format({"sentence1": "a", "sentence2": "b", "label": x})["targets"]
            for x in (3.27, 2.9, 5.0, 0.05, 1.1)] == ["3.2", "2.8", "5.0", "0.0", "1.2"]
    wsc = B.wsc_format({"text": "Mitchell asked Tom if he could lend some money.",
                        "span1_text": "Tom", "span1_index": 2, "span2_text": "he",
                        "span2_index": 4, "label": 1, "idx": 0})
    assert wsc["inputs"] == "wsc text: Mitchell asked * Tom * if # he # could lend some money."
    assert wsc["targets"] == "True"
    record = B.record_format({
        "passage": "This is the passage.\n@highlight\nhighlight1\n@highlight\nhighlight2",
        "query": "A @placeholder is a thing.", "entities": np.array([b"A", b"B", b"C"]),
        "answers": np.array([b"A", b"B"]), "idx": {"passage": 1, "query": 2}})
    assert [r["targets"] for r in record] == ["A", "B"]
    assert record[0]["inputs"] == ("record query: A @placeholder is a thing. entities: A, B, C "
                                   "passage: This is the passage. highlight1. highlight2")
    assert record[0]["answers"] == ["A", "B"] and record[0]["group"] == (1, 2)
    squad = B.squad_format({"question": "What's it?", "context": "It's (a) test.",
                            "answers": {"text": np.array([b"a test", b"test."]),
                                        "answer_start": np.array([8, 11])}})
    assert squad["inputs"] == "question: What ' s it ?  context: It ' s ( a ) test . "
    assert squad["targets"] == "a test" and squad["answers"] == ["a test", "test . "]
    impossible = B.squad_format({"question": "q", "context": "c", "is_impossible": True,
                                 "answers": {"text": np.array([], object)}})
    assert impossible["targets"] == B.UNANSWERABLE == impossible["answers"][0]


def test_postprocessing_and_metrics_with_invalid_predictions(tasks):
    cola = tasks["glue_cola"]
    assert [cola.postprocess(s) for s in ("acceptable", " unacceptable\n", "yes")] == [1, 0, -1]
    assert tasks["glue_stsb"].postprocess("3.4") == 3.4
    assert tasks["glue_stsb"].postprocess("three") == -1.0
    # T5's F1 with invalid predictions: -1 counts as the wrong class.
    assert B.f1_with_invalid([1, 1, 0, 0], [1, -1, -1, 0]) == B.metrics.f1([1, 1, 0, 0],
                                                                           [1, 0, 1, 0])
    # Macro F1 over the 3 CB classes only (an invalid prediction is never right).
    assert B.macro_f1([0, 1, 2], [0, 1, -1], num_classes=3)["f1_macro"] == \
        pytest.approx(100 * (1 + 1 + 0) / 3)
    targets = [{"group": g, "value": v} for g, v in [(1, 1), (1, 0), (2, 1), (2, 1)]]
    preds = [{"group": g, "value": v} for g, v in [(1, 1), (1, 0), (2, 1), (2, 0)]]
    assert B.multirc_em(targets, preds) == {"em": 50.0}
    assert B.multirc_f1a(targets, preds)["f1a"] == pytest.approx(100 * 2 * 2 / (2 + 3))
    record_t = [{"group": 1, "value": ["x", "y"]}, {"group": 1, "value": ["x", "y"]},
                {"group": 2, "value": ["z"]}]
    record_p = [{"group": 1, "value": "y"}, {"group": 1, "value": "y"},
                {"group": 2, "value": "w"}]
    assert B.record_squad(record_t, record_p) == {"em": 50.0, "f1": 50.0}


def test_classification_examples_on_mock_data(tasks, wordpiece):
    with tfds.testing.mock_data(num_examples=5):
        mrpc = B.classification_examples(tasks["glue_mrpc"], "validation", wordpiece, 16)
        stsb = B.classification_examples(tasks["glue_stsb"], "validation", wordpiece, 16)
        records = [tasks["glue_mrpc"].get_source("validation")[i] for i in range(5)]
    assert mrpc["encoder_input_tokens"].shape == (5, 16) and mrpc["label"].dtype == np.int32
    np.testing.assert_array_equal(mrpc["label"], [int(r["label"]) for r in records])
    for row, record in enumerate(records):
        ids, types = wordpiece.encode_pair(B.text(record["sentence1"]),
                                           B.text(record["sentence2"]))
        n = min(len(ids), 16)
        if len(ids) <= 16:  # untruncated rows equal the tokenizer's own pair encoding
            np.testing.assert_array_equal(mrpc["encoder_input_tokens"][row, :n], ids)
            np.testing.assert_array_equal(mrpc["token_type_ids"][row, :n], types)
        length = int(mrpc["encoder_segment_ids"][row].sum())
        assert mrpc["encoder_input_tokens"][row, 0] == wordpiece.cls_id
        assert mrpc["encoder_input_tokens"][row, length - 1] == wordpiece.sep_id
        assert (mrpc["encoder_input_tokens"][row, length:] == wordpiece.pad_id).all()
    assert "label" not in stsb and stsb["target"].dtype == np.float32
    with pytest.raises(ValueError, match="no sentence-pair form"):
        B.classification_examples(tasks["super_glue_copa"], "validation", wordpiece, 16)


def _bert_truncate(la, lb, budget):
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


def test_truncate_pair_matches_berts_loop():
    for la, lb, budget in itertools.product(range(12), range(12), range(1, 14)):
        assert B.truncate_pair(la, lb, budget) == _bert_truncate(la, lb, budget)


def test_register_benchmark_tasks(spm):
    from t2t.data import tasks as T
    before = {n: T.get_task(n) for n in T.registered_tasks()}   # t2t.data.catalog.paper's, if imported
    names = D.register_benchmark_tasks(spm, overwrite=True)
    try:
        assert get_task("glue_cola").vocabulary is spm and "squad_v2_0" in names
        with pytest.raises(ValueError, match="already registered"):
            D.register_benchmark_tasks(spm)
        D.register_benchmark_tasks(lambda: spm, overwrite=True)  # a lazy factory
        assert get_task("wmt16_enro").vocabulary is spm
    finally:
        for name in names:
            remove_task(name)
            if name in before:
                T.register_task(before[name])


def test_spread_keeps_the_label_mix_of_a_sorted_split():
    from t2t.data.finetune_tasks import spread
    labels = ["a"] * 50 + ["b"] * 30 + ["c"] * 20        # stored sorted by label, as BBC's
    picked = [labels[i] for i in spread(len(labels), 10)]
    assert picked == ["a"] * 5 + ["b"] * 3 + ["c"] * 2
    assert list(spread(7, None)) == list(range(7)) == list(spread(7, 9))
    assert len(set(spread(1000, 999))) == 999
