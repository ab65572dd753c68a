"""SQuAD span features: the reference's doc spans, exact answer round trips through the
WordPiece offsets, best-window answers, and parity with Hugging Face's fast tokenizer."""
import numpy as np
import pytest

from t2t.data import span_qa

from tests.data.helpers import squad_records, verses


def test_windows_start_every_doc_stride_until_one_reaches_the_end():
    assert span_qa.window_starts(10, 4, 2) == [0, 2, 4, 6]
    assert span_qa.window_starts(9, 4, 3) == [0, 3, 6]
    assert span_qa.window_starts(3, 4, 2) == [0]
    assert span_qa.window_starts(0, 4, 2) == [0]
    assert span_qa.window_starts(12, 4, 8) == [0, 4, 8]   # never skips a token


def test_every_window_holding_the_answer_points_at_its_exact_text(wordpiece):
    records = squad_records(60)
    spans = span_qa.span_features(records, wordpiece, max_length=40, doc_stride=12,
                                  max_query_length=8)
    f = spans.features
    assert f["encoder_input_tokens"].shape == (len(spans.example_index), 40)
    assert len(spans.contexts) == 60 and spans.example_index.max() == 59
    held = np.zeros(60, bool)
    for w, q in enumerate(spans.example_index):
        s, e = f["start_positions"][w], f["end_positions"][w]
        tokens = f["encoder_input_tokens"][w]
        assert tokens[0] == wordpiece.cls_id and f["token_type_ids"][w, s] == (s > 0)
        if s == 0:
            assert e == 0
            continue
        held[q] = True
        (a, _), (_, b) = spans.offsets[w, s], spans.offsets[w, e]
        assert spans.contexts[q][a:b] == records[q]["answers"]["text"][0]
    assert held.mean() > 0.9   # answers longer than a window are the only misses
    # every context token is in some window
    for q in range(60):
        covered = {tuple(o) for w in np.flatnonzero(spans.example_index == q)
                   for o in spans.offsets[w] if o[0] >= 0}
        _, offsets = wordpiece.encode_with_offsets(spans.contexts[q])
        assert covered == set(offsets)


def test_training_drops_questions_whose_answer_is_not_in_the_context(wordpiece):
    records = squad_records(4)
    records[1] = {**records[1], "answers": {"text": ["zebra crossing"], "answer_start": [3]}}
    records[2] = {**records[2], "answers": {"text": [], "answer_start": []}}
    train = span_qa.span_features(records, wordpiece, max_length=64, training=True)
    full = span_qa.span_features(records, wordpiece, max_length=64)
    assert len(train.contexts) == 2 and len(full.contexts) == 4
    assert (full.features["start_positions"][np.isin(full.example_index, [1, 2])] == 0).all()
    # an answer_start that is off finds the answer's first occurrence
    moved = {**records[0], "answers": {"text": records[0]["answers"]["text"][:1],
                                       "answer_start": [10_000]}}
    assert span_qa.answer_chars(span_qa.squad_record(moved)) is not None


def test_squad2_training_keeps_unanswerable_questions_pointing_at_cls(wordpiece):
    """SQuAD 2.0: an unanswerable question (is_impossible, or no answer) trains every
    window towards [CLS] = (0, 0); an answerable one whose answer is missing still drops."""
    records = squad_records(4)
    records[1] = {**records[1], "answers": {"text": ["zebra crossing"], "answer_start": [3]}}
    records[2] = {**records[2], "answers": {"text": [], "answer_start": []}}
    records[3] = {**records[3], "is_impossible": True}      # answers given, but impossible
    v2 = span_qa.span_features(records, wordpiece, max_length=64, doc_stride=16,
                               training=True, with_negatives=True)
    assert sorted(set(v2.example_index.tolist())) == [0, 1, 2]     # questions 0, 2, 3
    assert v2.answers[1] == [] and v2.answers[2] == []
    negatives = np.isin(v2.example_index, [1, 2])
    assert negatives.sum() >= 2
    assert (v2.features["start_positions"][negatives] == 0).all()
    assert (v2.features["end_positions"][negatives] == 0).all()
    assert (v2.features["start_positions"][v2.example_index == 0] > 0).any()


def test_null_score_diffs_take_the_smallest_null_and_the_best_span(wordpiece):
    """run_squad.py's v2 rule: score_null = min over windows of the [CLS] score, minus the
    best non-null span over all windows; "" above the threshold."""
    record = squad_records(1, words=2)[0]
    record["context"] = " ".join(verses(30)[:6])
    spans = span_qa.span_features([record], wordpiece, max_length=32, doc_stride=8,
                                  max_query_length=4)
    w = len(spans.example_index)
    first = int(np.flatnonzero(spans.offsets[0, :, 0] >= 0)[0])
    start, end = np.full(w, first), np.full(w, first)
    span_score = np.linspace(0.0, 1.0, w)                 # the last window's span is best
    null_score = np.linspace(3.0, 2.0, w)[::-1]           # smallest null: window 0 (2.0)
    answers, diffs = span_qa.null_score_diffs(spans, start, end, span_score, null_score)
    assert diffs == pytest.approx([2.0 - 1.0])
    assert answers == span_qa.best_answers(spans, start, end, span_score) and answers[0]
    assert span_qa.answers_at(answers, diffs, 0.5) == [""]
    assert span_qa.answers_at(answers, diffs, 1.0) == answers      # not above: answered
    none, inf = span_qa.null_score_diffs(spans, np.zeros(w, int), np.zeros(w, int),
                                         span_score, null_score)
    assert none == [""] and np.isinf(inf).all()


def test_best_answers_take_the_best_scoring_window(wordpiece):
    record = squad_records(1, words=2)[0]
    record["context"] = " ".join(verses(30)[:6])
    spans = span_qa.span_features([record], wordpiece, max_length=32, doc_stride=8,
                                  max_query_length=4)
    w = len(spans.example_index)
    assert w >= 3
    first = int(np.flatnonzero(spans.offsets[0, :, 0] >= 0)[0])   # first context token
    start = np.full(w, first)
    end = np.full(w, first + 1)
    score = np.arange(w, dtype=float)
    start[0] = 0                            # window 0 points at [CLS]: never an answer
    answers = span_qa.best_answers(spans, start, end, score)
    (a, _), (_, b) = spans.offsets[w - 1, first], spans.offsets[w - 1, first + 1]
    assert answers == [record["context"][a:b]]
    assert span_qa.best_answers(spans, np.zeros(w, int), np.zeros(w, int), score) == [""]


def test_windows_match_hugging_face_fast_tokenizer_overflow(minilm_vocab_file):
    """HF's `stride` is the overlap between windows: doc_stride = room - stride."""
    import transformers
    from t2t.data.vocab import WordPieceVocabulary
    hf = transformers.BertTokenizerFast(minilm_vocab_file)
    vocab = WordPieceVocabulary(minilm_vocab_file)
    records = squad_records(20, seed=3)
    max_length, doc_stride, query = 48, 16, 10
    spans = span_qa.span_features(records, vocab, max_length=max_length,
                                  doc_stride=doc_stride, max_query_length=query)
    rows = []
    for r in records:
        q = hf.decode(hf(r["question"], add_special_tokens=False)["input_ids"][:query])
        room = max_length - len(hf(q, add_special_tokens=False)["input_ids"]) - 3
        enc = hf(q, r["context"], truncation="only_second", max_length=max_length,
                 stride=room - doc_stride, return_overflowing_tokens=True,
                 padding="max_length")
        rows += enc["input_ids"]
    assert len(rows) > 2 * len(records)     # most questions need several windows
    assert np.array_equal(np.asarray(rows), spans.features["encoder_input_tokens"])
