"""Hugging Face task-head classes through `load_pretrained`, class by class, against
transformers on tiny random models (every tensor perturbed), padded batches, float32:

- `logits(...)` = HF's `.logits` (and `hidden_states` = the base model's
  `last_hidden_state`, checked on the sequence classifiers): sequence classification [batch, labels] (3 labels),
  token classification [batch, length, labels] (5), question answering [batch, length, 2]
  (start, end), multiple choice [batch, choices] from [batch, choices, length], for BERT,
  RoBERTa, ALBERT, ELECTRA and DistilBERT (BigBird: all but question answering); GPT-2's sequence (last real token) and token
  classification; T5ForConditionalGeneration with decoder_input_ids [batch, target, vocab];
- the tree is t2t's own fine-tuning head (`t2t.models.classifiers`): the fine-tuning
  model the family's registry entry gives (`families.head`) computes the same logits from it;
- `save_pretrained` writes the class back with its labels and the same tensors, which
  transformers reloads with the same logits (to an ulp: its own save and reload of a
  multiple-choice model moves one too);
- a head checkpoint without a backbone tensor is one line (without its head: the head is
  initialised, tests/convert/test_hf_missing_heads.py).
"""
import json

import jax
import numpy as np
import pytest
import torch
import transformers as t
from safetensors.numpy import load_file, save_file

from t2t.convert import hf as convert
from t2t.convert.pretrained import PretrainedError, family_of
from t2t.models import families
from t2t.models.classifiers import BART_HEAD, MultipleChoice, SequenceClassifier
from tests.convert.helpers import L, V, padded_batch, perturb, tiny_configs

TOL = 1e-5
ENCODERS = {"Bert": "bert", "Roberta": "roberta", "Albert": "albert", "Electra": "electra",
            "DistilBert": "distilbert"}
# HF class suffix -> num_labels (a multiple-choice head has one output per choice)
LABELS = {"SequenceClassification": 3, "TokenClassification": 5, "QuestionAnswering": 2,
          "MultipleChoice": 1}
CASES = {**{f"{prefix}For{suffix}": (family, n) for prefix, family in ENCODERS.items()
            for suffix, n in LABELS.items()},
         **{f"BigBirdFor{suffix}": ("big_bird", LABELS[suffix]) for suffix in
            ("SequenceClassification", "TokenClassification", "MultipleChoice")},
         "GPT2ForSequenceClassification": ("gpt2", 3),
         "GPT2ForTokenClassification": ("gpt2", 4),
         "T5ForConditionalGeneration": ("t5", None)}
CHOICES, TARGET = 3, 7
TYPED = {"bert", "albert", "electra", "big_bird"}      # two token types: the batch uses both


def _make(cls, family, num_labels):
    torch.manual_seed(0)
    config = tiny_configs()[family]()
    if num_labels is not None:
        config.num_labels = num_labels
    if family == "gpt2":
        config.pad_token_id = 0          # GPT2ForSequenceClassification finds the last token
    if family == "t5":                   # |logits| O(1), as in test_t5_parity.py
        config.initializer_factor = 0.5
    model = getattr(t, cls)(config).eval()
    perturb(model)
    return model


def _inputs(cls, family, pad_id):
    """(ids, mask, the other inputs `cls` reads) of a padded batch."""
    ids, mask = padded_batch(3, V, L, pad_id)
    extra = {}
    if family in TYPED:
        extra["token_type_ids"] = np.broadcast_to(np.arange(L) >= L // 2, ids.shape).astype(
            np.int64) * mask
    if cls.endswith("MultipleChoice"):    # each choice of a row padded differently
        def stack(x):
            return np.stack([np.roll(x, k, axis=0) for k in range(CHOICES)], axis=1)
        ids, mask = stack(ids), stack(mask)
        extra = {k: stack(v) for k, v in extra.items()}
    if family == "t5":
        dec, dec_mask = padded_batch(3, V, TARGET, 0, ends=(None, 4, 2))
        extra = {"decoder_input_ids": dec, "decoder_attention_mask": dec_mask}
    return ids, mask, extra


def _hf(model, ids, mask, extra):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                    **{k: torch.tensor(v) for k, v in extra.items()})
    if hasattr(out, "start_logits"):
        return np.stack([out.start_logits.numpy(), out.end_logits.numpy()], axis=-1)
    return out.logits.numpy()


def _where(cls, mask, extra, logits):
    """The positions compared: every row of a pooled head, the real tokens of a per-token
    one (padding's outputs are not defined the same way)."""
    if cls.startswith("T5"):
        return extra["decoder_attention_mask"].astype(bool)
    if logits.ndim == mask.ndim + 1 and logits.shape[:mask.ndim] == mask.shape:
        return mask.astype(bool)
    return np.ones(logits.shape[:-1] if logits.ndim > 1 else logits.shape, bool)


@pytest.fixture(scope="module", params=list(CASES))
def head(request, tmp_path_factory):
    cls = request.param
    family, num_labels = CASES[cls]
    model = _make(cls, family, num_labels)
    path = tmp_path_factory.mktemp(cls)
    model.save_pretrained(path, safe_serialization=True)
    return cls, family, model, path


def test_logits_parity_and_save_round_trip(head, tmp_path):
    cls, family, model, path = head
    m = convert.load_pretrained(path)
    assert m.architecture == cls
    ids, mask, extra = _inputs(cls, family, m.pad_token_id)
    ref = _hf(model, ids, mask, extra)
    ours = m.logits(ids, mask, **extra)
    assert ours.shape == ref.shape
    where = _where(cls, mask, extra, ref)
    diff = np.abs(ours - ref)[where].max()
    print(f"{cls}: logits {ref.shape}, max|diff| {diff:.3g}")
    assert diff < TOL

    if cls.endswith("SequenceClassification"):     # the backbone's states, as its base's
        with torch.no_grad():
            base = model.base_model(input_ids=torch.tensor(ids),
                                    attention_mask=torch.tensor(mask)).last_hidden_state
        hidden = np.abs(m.hidden_states(ids, mask) - base.numpy())[mask.astype(bool)]
        assert hidden.max() < TOL

    convert.save_pretrained(m, tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [cls]
    if CASES[cls][1] is not None:
        assert len(written["id2label"]) == model.config.num_labels
    again = convert.load_pretrained(tmp_path)
    assert (again.architecture, again.config) == (cls, m.config)
    jax.tree.map(np.testing.assert_array_equal, again.params, m.params)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    # the same tensors: transformers' own save and reload can move a logit by an ulp
    np.testing.assert_allclose(_hf(reloaded, ids, mask, extra), ref, rtol=0, atol=1e-6)
    if family == "t5":
        with pytest.raises(PretrainedError, match="needs decoder_input_ids"):
            m.logits(ids, mask)
        with pytest.raises(PretrainedError, match="takes no labels"):
            m.logits(ids, mask, labels=ids)


# HF class suffix -> t2t's fine-tuning model and task kind
FINETUNE = {"SequenceClassification": (SequenceClassifier, "classification"),
            "MultipleChoice": (MultipleChoice, "multiple_choice")}


@pytest.mark.parametrize("cls", ["RobertaForSequenceClassification", "ElectraForMultipleChoice",
                                 "DistilBertForSequenceClassification",
                                 "BigBirdForSequenceClassification"])
def test_the_tree_is_the_families_fine_tuning_head(cls, tmp_path):
    """Pooled heads unlike BERT's: t2t's fine-tuning model with the pooler style the
    family's registry entry gives reads the loaded tree unchanged (every leaf copied, none
    new) and gives HF's logits."""
    family, n = CASES[cls]
    model = _make(cls, family, n)
    model.save_pretrained(tmp_path, safe_serialization=True)
    m = convert.load_pretrained(tmp_path)
    ids, mask, extra = _inputs(cls, family, m.pad_token_id)
    wrapper, kind = FINETUNE[cls.split("For")[1]]
    style = families.head_style(family_of(m.model_type), kind)
    ft = wrapper(m.config, CHOICES if kind == "multiple_choice" else n, style=style)
    batch = {"encoder_input_tokens": ids.astype(np.int32),
             "encoder_segment_ids": mask.astype(np.int32)}
    batch.update({k: v.astype(np.int32) for k, v in extra.items()})
    params, report = ft.init_from_pretrained(jax.random.PRNGKey(0), batch, m.params,
                                             return_report=True)
    assert not report.new and not report.unused
    ours = np.asarray(ft.apply(params, batch))
    assert np.abs(ours - _hf(model, ids, mask, extra)).max() < TOL


def test_the_registry_binds_each_familys_pooler():
    assert families.head("roberta", "classification").keywords["style"].dropout_first
    assert families.head_style("electra", "classification").activation == "gelu"
    assert families.head_style("distill", "multiple_choice").activation == "relu"
    assert families.head("bert", "classification") is SequenceClassifier
    for kind in ("classification", "regression"):   # an HF BART directory's head keeps
        assert families.head_style("bart", kind) == BART_HEAD    # its dropout before dense


def test_a_head_class_without_a_backbone_tensor_is_one_line(tmp_path):
    model = _make("BertForSequenceClassification", "bert", 3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    state = load_file(tmp_path / "model.safetensors")
    missing = "bert.embeddings.word_embeddings.weight"
    save_file({k: v for k, v in state.items() if k != missing},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(PretrainedError, match=f"no tensor '{missing}'") as e:
        convert.load_pretrained(tmp_path)
    assert "\n" not in str(e.value)
