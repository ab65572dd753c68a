"""SQuAD 2.0 through `span_qa_experiment` (gin): unanswerable questions train towards the
[CLS], the null threshold is the official `find_best_thresh`'s on the validation split and
is applied to every split's predictions."""
import numpy as np
import pytest

from t2t.run import finetune

from tests.data.helpers import squad_records
from tests.train.test_finetune import _parse_squad


def _v2_records(n, seed):
    records = squad_records(n, seed=seed)
    for i in range(0, n, 3):               # every third question unanswerable
        records[i] = {**records[i], "answers": {"text": [], "answer_start": []},
                      "is_impossible": True}
    return records


@pytest.fixture(scope="module")
def squad2_task():
    from t2t.data.finetune_tasks import FinetuneTask
    from t2t.data.tasks import register_task
    records = {"train": _v2_records(30, 0), "validation": _v2_records(12, 1),
               "test": _v2_records(9, 2)}
    task = FinetuneTask("test_squad2_verses", lambda split: records[split], [])
    register_task(task, overwrite=True)
    return task


def _experiment(model_dir, *extra):
    _parse_squad(model_dir, "MIXTURE_OR_TASK_NAME = 'test_squad2_verses'", *extra)
    return finetune.finetune_experiment()


def test_v2_is_detected_and_trains_unanswerable_windows_on_cls(squad2_task, tmp_path):
    exp = _experiment(tmp_path)
    assert exp.version_2_with_negative and exp.null_threshold is None
    windows = exp.train_windows()
    impossible = [q for q, golds in enumerate(windows.answers) if not golds]
    assert len(impossible) == 10                     # kept, unlike v1.1 training
    rows = np.isin(windows.example_index, impossible)
    assert (windows.features["start_positions"][rows] == 0).all()


def test_null_threshold_is_chosen_on_validation_and_applied(squad2_task, tmp_path,
                                                            monkeypatch):
    """An oracle whose null score is below its (gold) span's by 1 on answerable questions
    and above it by 1 on unanswerable ones: the validation threshold separates them, the
    test split scores 100 with it, and a fixed threshold of 2 answers every question."""
    exp = _experiment(tmp_path)

    def oracle(model, params, features, **_):
        gold = features["start_positions"] > 0
        n = len(gold)
        start = np.where(gold, features["start_positions"], 0)
        # an answerable question's windows: span 1, null 0; unanswerable: span 0 at a
        # context token, null 1 (its best span text is some context word)
        types = features["token_type_ids"]
        first = np.argmax(types == 1, axis=1)
        return {"start": np.where(gold, start, first),
                "end": np.where(gold, features["end_positions"], first),
                "span_score": np.where(gold, 1.0, 0.0),
                "null_score": np.where(gold, 0.0, np.zeros(n) + 1.0)}

    monkeypatch.setattr(finetune.evaluator, "predict_spans", oracle)
    test_scores = exp.evaluate(None, "test", batch_size=8)    # scores validation first
    assert exp._dev_threshold is not None and -1.0 <= exp._dev_threshold < 1.0
    answerable = {int(q) for q in exp.span_features("test").example_index[
        exp.span_features("test").features["start_positions"] > 0]}
    assert test_scores["NoAns_exact"] == 100.0 and test_scores["NoAns_total"] == 3
    assert test_scores["HasAns_exact"] == pytest.approx(100.0 * len(answerable) / 6)
    assert test_scores["null_threshold"] == exp._dev_threshold
    assert test_scores["best_f1"] >= test_scores["f1"]

    fixed = _experiment(tmp_path, "span_qa_experiment.null_threshold = 2.0")
    scores = fixed.evaluate(None, "test", batch_size=8)
    assert scores["NoAns_exact"] == 0.0 and scores["null_threshold"] == 2.0
    assert scores["HasAns_exact"] == test_scores["HasAns_exact"]
