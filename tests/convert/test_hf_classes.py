"""Every HF class `load_pretrained` reads, class by class, against transformers on tiny
random models (each tensor perturbed), padded batches, float32:

- `hidden_states(ids, mask)` = the base class's `last_hidden_state` (T5: the encoder's), for
  the base models and the pretraining classes alike;
- `AlbertForMaskedLM`: its MLM logits, the pooler and SOP head it lacks initialised and
  named in one log line;
- `save_pretrained` writes the class that was loaded, and transformers' reload of it gives
  bit-identical outputs;
- a class t2t does not read is one line naming those it does.
"""
import json
import logging

import jax
import numpy as np
import pytest

import torch  # noqa: E402  (the test extra: never skipped)
import transformers as t  # noqa: E402  (the test extra: never skipped)

from t2t.convert import hf as convert  # noqa: E402
from t2t.convert.pretrained import PretrainedError  # noqa: E402
from tests.convert.helpers import (L, V, hf_logits, padded_batch, perturb,  # noqa: E402
                                    tiny_configs)

TOL = 1e-5
# HF class -> its family's tiny config
BASE = {"BertModel": "bert", "RobertaModel": "roberta", "AlbertModel": "albert",
        "ElectraModel": "electra", "DistilBertModel": "distilbert", "OpenAIGPTModel": "gpt1",
        "GPT2Model": "gpt2", "T5Model": "t5", "T5EncoderModel": "t5", "XLNetModel": "xlnet"}
PRETRAINING = {"BertForPreTraining": "bert", "RobertaForMaskedLM": "roberta",
               "AlbertForPreTraining": "albert", "AlbertForMaskedLM": "albert",
               "ElectraForPreTraining": "electra", "ElectraForMaskedLM": "electra",
               "DistilBertForMaskedLM": "distilbert", "OpenAIGPTLMHeadModel": "gpt1",
               "GPT2LMHeadModel": "gpt2", "T5ForConditionalGeneration": "t5",
               "XLNetLMHeadModel": "xlnet"}
CLASSES = {**BASE, **PRETRAINING}


def _make(cls, family=None):
    """A tiny `cls` of `family` (default: its row in CLASSES), seeded, every tensor perturbed."""
    torch.manual_seed(0)
    model = getattr(t, cls)(tiny_configs()[family or CLASSES[cls]]()).eval()
    perturb(model)
    return model


@pytest.fixture(scope="module", params=list(CLASSES))
def hf_dir(request, tmp_path_factory):
    model = _make(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return request.param, model, path


def _hf_hidden(model, ids, mask):
    """The base class's last_hidden_state (T5: the encoder's)."""
    base = model.get_encoder() if isinstance(model, t.T5PreTrainedModel) else model.base_model
    with torch.no_grad():
        return base(input_ids=torch.tensor(ids),
                    attention_mask=torch.tensor(mask)).last_hidden_state.numpy()


def _batch(m):
    return padded_batch(3, V, L, m.pad_token_id)


def test_hidden_states_parity(hf_dir):
    cls, model, path = hf_dir
    m = convert.load_pretrained(path)
    assert m.architecture == cls
    ids, mask = _batch(m)
    ref, ours = _hf_hidden(model, ids, mask), m.hidden_states(ids, mask)
    assert ours.shape == ref.shape == (3, L, 32)
    diff = np.abs(ours - ref)[mask.astype(bool)].max()
    print(f"{cls}: max|hidden diff| {diff:.3g}")
    assert diff < TOL


def test_save_writes_the_class_back(hf_dir, tmp_path):
    cls, model, path = hf_dir
    m = convert.load_pretrained(path)
    convert.save_pretrained(m, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls]
    again = convert.load_pretrained(tmp_path)
    assert (again.architecture, again.config) == (cls, m.config)
    jax.tree.map(np.testing.assert_array_equal, again.params, m.params)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    ids, mask = _batch(m)
    np.testing.assert_array_equal(_hf_hidden(reloaded, ids, mask), _hf_hidden(model, ids, mask))
    if cls not in BASE and not cls.startswith("T5"):
        np.testing.assert_array_equal(hf_logits(reloaded, ids, mask),
                                      hf_logits(model, ids, mask))


def test_albert_for_masked_lm(tmp_path, caplog):
    """albert-base-v2's form: MLM logits = HF's; the pooler and SOP head it lacks are
    initialised, named in one log line, and left out again on save."""
    model = _make("AlbertForMaskedLM")
    model.save_pretrained(tmp_path, safe_serialization=True)
    with caplog.at_level(logging.WARNING, logger="t2t.convert.rules"):
        m = convert.load_pretrained(tmp_path)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "pooler" in lines[0] and "nsp_head" in lines[0], lines
    assert {"pooler", "nsp_head", "mlm_head"} <= set(m.params)
    ids, mask = _batch(m)
    ref, ours = hf_logits(model, ids, mask), m.logits(ids, mask)
    assert ours.shape == ref.shape == (3, L, V)
    assert np.abs(ours - ref)[mask.astype(bool)].max() < TOL


def test_unsupported_class_one_line(tmp_path):
    config = tiny_configs()["roberta"]().to_dict()
    config["architectures"] = ["RobertaForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(PretrainedError, match="'RobertaForCausalLM' is not supported") as e:
        convert.load_pretrained(tmp_path)
    assert "RobertaModel" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("cls,read_as,head", [
    ("GPT2DoubleHeadsModel", "GPT2LMHeadModel", "multiple_choice_head."),
    ("BigBirdForQuestionAnswering", "BigBirdModel", "qa_classifier.")])
def test_a_head_t2t_does_not_map_yet_loads_its_backbone_and_names_the_rest(
        cls, read_as, head, tmp_path, caplog):
    """A head t2t does not map (tests/convert/test_hf_heads.py has those it does): the
    backbone (hidden states = HF's), the head's tensors named as ignored, the class read as
    said in one line."""
    model = _make(cls, {"Bert": "bert", "BigBird": "big_bird"}.get(cls.split("For")[0], "gpt2"))
    model.save_pretrained(tmp_path, safe_serialization=True)
    with caplog.at_level(logging.WARNING, logger="t2t.convert"):
        m = convert.load_pretrained(tmp_path)
    said = [r.getMessage() for r in caplog.records]
    assert m.architecture == read_as
    assert any(f"{cls}: t2t reads it as {read_as}" in line for line in said), said
    assert any("ignored" in line and head in line for line in said), said
    ids, mask = _batch(m)
    diff = np.abs(m.hidden_states(ids, mask) - _hf_hidden(model, ids, mask))
    assert diff[mask.astype(bool)].max() < TOL
