"""Hugging Face Longformer <-> t2t: logits equal to transformers' on padded batches with
global tokens (per-layer windows [4, 6], lengths that are not multiples of the window),
exact round trips, and the "long" conversion of a RoBERTa."""
import numpy as np
import pytest
import torch

from t2t.cli import main
from t2t.convert import hf_longformer
from t2t.convert.pretrained import load_pretrained, save_pretrained
from tests.convert.helpers import BERTISH, V, hf_logits, padded_batch, perturb

L = 19          # HF pads to 24 (a multiple of the largest window), t2t pads inside


def _hf_config(**kw):
    import transformers as t
    return t.LongformerConfig(vocab_size=V, type_vocab_size=1, pad_token_id=1,
                              attention_window=[4, 6],
                              **dict(BERTISH, max_position_embeddings=L + 8), **kw)


def _save(cls_name, tmp_path, **kw):
    import transformers as t
    torch.manual_seed(0)
    model = getattr(t, cls_name)(_hf_config(**kw)).eval()
    perturb(model)
    model.save_pretrained(tmp_path / "hf")
    return model


def _batch():
    ids, mask = padded_batch(3, V, L, pad_id=1, ends=(None, 15, 6))
    ids[:, 0] = 0                                                 # <s>
    glob = np.zeros_like(ids)
    glob[0, [0, 9]] = 1          # far outside each other's windows
    glob[1, [0, 1, 2, 12]] = 1
    glob[2, 3] = 1
    return ids, mask, glob


def _diff(a, b, mask=None):
    d = np.abs(np.asarray(a) - np.asarray(b))
    return float((d[mask.astype(bool)] if mask is not None else d).max())


@pytest.mark.parametrize("cls_name", ["LongformerForMaskedLM",
                                      "LongformerForSequenceClassification"])
def test_logits_equal_transformers_with_and_without_global_tokens(cls_name, tmp_path):
    hf = _save(cls_name, tmp_path, num_labels=3)
    model = load_pretrained(tmp_path / "hf")
    ids, mask, glob = _batch()
    for g in (glob, None):        # None: the class's default (the [CLS] / nothing)
        extra = {} if g is None else {"global_attention_mask": g}
        ours = model.logits(ids, mask, **extra)
        theirs = hf_logits(hf, ids, mask, **extra)
        assert ours.shape == theirs.shape
        assert _diff(ours, theirs, mask if ours.ndim == 3 else None) < 1e-5


def test_base_model_hidden_states_and_round_trips_are_exact(tmp_path):
    import transformers as t
    hf = _save("LongformerModel", tmp_path)
    model = load_pretrained(tmp_path / "hf")
    ids, mask, _ = _batch()
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids),
                    attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert _diff(model.hidden_states(ids, mask), theirs, mask) < 1e-5
    for cls_name in ("LongformerModel", "LongformerForMaskedLM",
                     "LongformerForSequenceClassification"):
        if cls_name != "LongformerModel":
            hf = _save(cls_name, tmp_path / cls_name)
            model = load_pretrained(tmp_path / cls_name / "hf")
        out = tmp_path / cls_name / "t2t"
        save_pretrained(model, out)
        back = getattr(t, cls_name).from_pretrained(out).eval()
        assert type(back).__name__ == cls_name
        assert back.config.attention_window == [4, 6]
        theirs = hf.state_dict()
        for name, value in back.state_dict().items():
            assert torch.equal(value, theirs[name]), name


def test_question_answering_default_global_tokens_are_the_question(tmp_path):
    hf = _save("LongformerForQuestionAnswering", tmp_path)
    model = load_pretrained(tmp_path / "hf")
    ids, mask = padded_batch(3, V, L, pad_id=1, ends=(None, 15, 9))
    ids = np.where(ids == 2, 5, ids)
    ids[:, 0] = 0
    ids[:, [4, 5]] = 2               # <s> question </s></s> context </s>
    ids[np.arange(3), mask.sum(1) - 1] = 2
    with torch.no_grad():
        out = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    ours = model.logits(ids, mask)
    assert _diff(ours[..., 0], out.start_logits.numpy(), mask) < 1e-5
    assert _diff(ours[..., 1], out.end_logits.numpy(), mask) < 1e-5


def test_long_roberta_copies_positions_and_projections(tmp_path, capsys):
    """`t2t convert --long`, the paper's recipe exactly: rows 2.. of the new table are the
    24 learned rows over and over; the global projections are the local ones; the result
    loads in transformers as a Longformer whose output equals the RoBERTa's where the
    window covers the input."""
    import transformers as t
    torch.manual_seed(0)
    roberta = t.RobertaForMaskedLM(t.RobertaConfig(
        vocab_size=V, type_vocab_size=1, pad_token_id=1,
        **dict(BERTISH, max_position_embeddings=24 + 2))).eval()
    perturb(roberta)
    roberta.save_pretrained(tmp_path / "roberta")
    assert main(["convert", str(tmp_path / "roberta"), str(tmp_path / "long"),
                 "--long", "60", "--window", "24"]) == 0
    assert "LongformerForMaskedLM (longformer)" in capsys.readouterr().out
    hf, info = t.LongformerForMaskedLM.from_pretrained(tmp_path / "long",
                                                       output_loading_info=True)
    hf.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    old = roberta.roberta.embeddings.position_embeddings.weight.detach().numpy()
    new = hf.longformer.embeddings.position_embeddings.weight.detach().numpy()
    assert new.shape == (62, 32)
    np.testing.assert_array_equal(new[:2], old[:2])
    for start in range(2, 62, 24):
        np.testing.assert_array_equal(new[start:start + 24], old[2:2 + min(24, 62 - start)])
    layer = hf.longformer.encoder.layer[1].attention.self
    for local, copied in (("query", "query_global"), ("key", "key_global"),
                          ("value", "value_global")):
        assert torch.equal(getattr(layer, local).weight, getattr(layer, copied).weight)
    ids, mask = padded_batch(3, V, 12, pad_id=1, ends=(None, 9, 4))
    assert _diff(hf_logits(hf, ids, mask), hf_logits(roberta, ids, mask), mask) < 1e-5


def test_long_conversion_of_another_family_is_one_line(tmp_path, capsys):
    import transformers as t
    t.BertForMaskedLM(t.BertConfig(vocab_size=V, **BERTISH)).save_pretrained(tmp_path / "b")
    assert main(["convert", str(tmp_path / "b"), str(tmp_path / "out"), "--long", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "reads a RoBERTa checkpoint, not 'bert'" in err
    long = hf_longformer.long_positions(np.arange(8)[:, None], 10, offset=2)
    np.testing.assert_array_equal(long[:, 0], [0, 1, 2, 3, 4, 5, 6, 7, 2, 3, 4, 5])
