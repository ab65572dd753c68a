"""A Hugging Face task-head checkpoint without its head tensors (a backbone saved under a
head class, as transformers reads it with a fresh head): `load_pretrained` reads the
backbone as the full checkpoint gives it and initialises the head it lacks, its label count
from config.json (`id2label`, else transformers' default of 2, which config.json leaves
out; a fixed count for multiple choice and question answering), naming it in one log line;
the tree is the full checkpoint's in every path and shape, and a second read is identical."""
import logging

import numpy as np
import pytest
import transformers as t
from flax import traverse_util
from safetensors.numpy import load_file, save_file

from t2t.convert import hf as convert
from tests.convert.helpers import L, V, padded_batch, perturb, tiny_configs

# class -> (family, num_labels, its backbone's prefix, outputs expected, initialised modules)
CASES = {
    "BertForSequenceClassification": ("bert", 3, "bert.", 3, "classifier/dense"),
    "RobertaForSequenceClassification": ("roberta", 2, "roberta.", 2,
                                         "classifier/dense, pooler/dense"),
    "AlbertForTokenClassification": ("albert", 5, "albert.", 5, "tagger/dense"),
    "DistilBertForQuestionAnswering": ("distilbert", 2, "distilbert.", 2, "qa_outputs/dense"),
    "ElectraForMultipleChoice": ("electra", 4, "electra.", 1,
                                 "classifier/dense, pooler/dense"),
}


def _flat(params):
    return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(params).items()}


@pytest.mark.parametrize("cls", list(CASES))
def test_a_missing_head_is_initialised_and_named_in_one_line(cls, tmp_path, caplog):
    family, num_labels, backbone, outputs, named = CASES[cls]
    config = tiny_configs()[family]()
    config.num_labels = num_labels
    model = getattr(t, cls)(config).eval()
    perturb(model)
    full, stripped = tmp_path / "full", tmp_path / "stripped"
    model.save_pretrained(full, safe_serialization=True)
    model.save_pretrained(stripped, safe_serialization=True)
    state = load_file(stripped / "model.safetensors")
    head = sorted(k for k in state if not k.startswith(backbone))
    assert head
    save_file({k: v for k, v in state.items() if k not in head},
              stripped / "model.safetensors", metadata={"format": "pt"})

    reference = _flat(convert.load_pretrained(full).params)
    with caplog.at_level(logging.INFO):
        loaded = convert.load_pretrained(stripped)
    said = [r.getMessage() for r in caplog.records if "initialised" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(f": initialised {named}"), said
    if cls.endswith(("MultipleChoice", "QuestionAnswering")):     # outputs not labels
        assert "labels from" not in said[0]
    else:
        source = "config.json's id2label" if num_labels != 2 else "transformers' default"
        assert f"{outputs} labels from {source}" in said[0]

    got = _flat(loaded.params)
    assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in reference.items()}
    new = {k for k in got if any(k.startswith(m + "/") for m in named.split(", "))}
    for k in got:
        if k in new:
            assert not np.array_equal(got[k], reference[k]), k
            if k.endswith("bias"):
                assert not got[k].any(), k
        else:
            np.testing.assert_array_equal(got[k], reference[k], err_msg=k)
    again = _flat(convert.load_pretrained(stripped).params)
    assert all(np.array_equal(again[k], got[k]) for k in got)     # seeded: a reload is equal

    ids, mask = padded_batch(3, V, L, loaded.pad_token_id)
    if cls.endswith("MultipleChoice"):
        ids, mask = np.stack([ids, ids], axis=1), np.stack([mask, mask], axis=1)
    logits = loaded.logits(ids, mask)
    assert np.isfinite(logits).all() and logits.shape[-1] == (2 if cls.endswith(
        "MultipleChoice") else outputs)
