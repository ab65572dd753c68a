"""BART parity: tiny random HF BART (final_logits_bias set nonzero) -> t2t.convert.pretrained
-> EncoderDecoder logits on a padded batch, the KV-cached decoder, and save_pretrained back to
the same class (transformers reloads it and computes the same)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from t2t.convert.hf_bart import bart_config, bart_hf_config
from t2t.convert.pretrained import load_pretrained, save_pretrained
from t2t.nn.stacks import EncoderDecoder

TOL = 1e-5
VOCAB, B, IN_LEN, OUT_LEN = 100, 3, 20, 12


def _hf_config():
    return transformers.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """class name -> (HF model in eval mode, directory), one set of random weights."""
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(_hf_config()).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)   # nonzero: the bias path is checked
        for p in model.parameters():               # non-trivial norms and biases
            p.add_(0.05 * torch.randn_like(p))
    out = {}
    for cls in ("BartForConditionalGeneration", "BartModel"):
        path = str(tmp_path_factory.mktemp(cls))
        m = model if cls == "BartForConditionalGeneration" else model.model
        m.save_pretrained(path, safe_serialization=True)
        out[cls] = (getattr(transformers, cls).from_pretrained(path).eval(), path)
    return out


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    ids = rng.randint(3, VOCAB, (B, IN_LEN)).astype(np.int32)
    mask = np.ones((B, IN_LEN), np.int32)
    mask[1, 13:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = 1                           # BART's pad id
    dec = rng.randint(3, VOCAB, (B, OUT_LEN)).astype(np.int32)
    dec[:, 0] = 2                                # decoder_start_token_id
    return ids, mask, dec


def _hf(model, ids, mask, dec):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids, dtype=torch.long),
                     attention_mask=torch.tensor(mask, dtype=torch.long),
                     decoder_input_ids=torch.tensor(dec, dtype=torch.long))


def test_config_round_trip(hf_dirs):
    d = _hf_config().to_dict()
    config = bart_config(d)
    assert (config.position_offset, config.decoder_start_id, config.max_length) == (2, 2, 66)
    assert config.final_logits_bias and config.embedding_norm and not config.pre_norm
    back = bart_hf_config(config)
    for key, value in back.items():
        if key in d and key != "architectures":
            assert d[key] == value, key
    assert bart_config(back) == config


def test_logits_parity_and_save(hf_dirs, batch, tmp_path):
    model, path = hf_dirs["BartForConditionalGeneration"]
    ids, mask, dec = batch
    ref = _hf(model, ids, mask, dec).logits.numpy()
    loaded = load_pretrained(path)
    ours = np.asarray(loaded.logits(ids, mask, decoder_input_ids=dec))
    diff = np.abs(ours - ref).max()
    print(f"BART logits max abs diff {diff:.3g}")
    assert diff < TOL
    save_pretrained(loaded, str(tmp_path))
    reloaded = transformers.BartForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_array_equal(_hf(reloaded, ids, mask, dec).logits.numpy(), ref)


def test_bart_model_round_trip(hf_dirs, batch, tmp_path):
    """BartModel (no LM head, no final_logits_bias): t2t's decoder states == HF's
    last_hidden_state; saved back as a BartModel transformers reloads."""
    model, path = hf_dirs["BartModel"]
    ids, mask, dec = batch
    ref = _hf(model, ids, mask, dec).last_hidden_state.numpy()
    loaded = load_pretrained(path)
    assert loaded.architecture == "BartModel"
    net = EncoderDecoder(loaded.config)
    enc = net.apply({"params": loaded.params}, ids, mask, method=net.encode)
    ours = np.asarray(net.apply({"params": loaded.params}, dec, enc, None, mask,
                                method=lambda m, *a: m.decoder(*a, return_hidden=True)))
    assert np.abs(ours - ref).max() < TOL
    save_pretrained(loaded, str(tmp_path))
    reloaded = transformers.BartModel.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_array_equal(_hf(reloaded, ids, mask, dec).last_hidden_state.numpy(), ref)


@pytest.mark.parametrize("cls", ["BartModel", "BartForConditionalGeneration",
                                 "BartForSequenceClassification"])
def test_hidden_states_are_bart_models_without_decoder_inputs(cls, hf_dirs, classifier_dir,
                                                               batch):
    """`hidden_states(ids, mask)` of every BART class == HF BartModel's last_hidden_state
    when given no decoder_input_ids (its decoder reads the ids shifted right)."""
    model, path = classifier_dir if cls == "BartForSequenceClassification" else hf_dirs[cls]
    base = model if cls == "BartModel" else model.model
    ids, mask, _ = batch
    with torch.no_grad():
        ref = base(input_ids=torch.tensor(ids, dtype=torch.long),
                   attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state
    ours = load_pretrained(path).hidden_states(ids, mask)
    assert np.abs(ours - ref.numpy()).max() < TOL


def test_cached_decoding_parity(hf_dirs, batch):
    """One token at a time through t2t's KV cache (decoder positions offset by 2 there too)
    == the full decoder pass == HF."""
    model, path = hf_dirs["BartForConditionalGeneration"]
    loaded = load_pretrained(path)
    net, params = EncoderDecoder(loaded.config), loaded.params
    ids, mask, dec = batch
    encoded = net.apply({"params": params}, ids, mask, method=net.encode)
    cache = net.apply({"params": params}, encoded, jnp.zeros((B, OUT_LEN), jnp.int32), mask,
                      method=net.decode, decode=True, mutable=["cache"])[1]["cache"]
    step = jax.jit(lambda c, tok: net.apply({"params": params, "cache": c}, encoded, tok, mask,
                                            method=net.decode, decode=True, mutable=["cache"]))
    ours = []
    for t in range(OUT_LEN):
        logits, state = step(cache, dec[:, t:t + 1])
        cache = state["cache"]
        ours.append(np.asarray(logits[:, 0]))
    ref = _hf(model, ids, mask, dec).logits.numpy()
    assert np.abs(np.stack(ours, axis=1) - ref).max() < TOL


# ----------------------------------------------------------------------- classification
LABELS = 3


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """A tiny random BartForSequenceClassification (3 labels) saved by transformers."""
    torch.manual_seed(1)
    model = transformers.BartForSequenceClassification(
        _hf_config().__class__(**{**_hf_config().to_dict(), "num_labels": LABELS})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("BartForSequenceClassification"))
    model.save_pretrained(path, safe_serialization=True)
    return model, path


def _pair_rows():
    """Right-padded `<s> a </s></s> b </s>` rows of three lengths (every row has three
    </s>, as HF's pooling needs), pad id 1; the second row has a real token after its last
    </s>, so pooling at the last </s> differs from pooling at the last token."""
    rng = np.random.RandomState(2)
    ids = np.ones((B, IN_LEN), np.int32)
    mask = np.zeros((B, IN_LEN), np.int32)
    for row, (a, b) in enumerate(((6, 10), (4, 5), (2, 1))):
        tokens = [0, *rng.randint(3, VOCAB, a), 2, 2, *rng.randint(3, VOCAB, b), 2]
        tokens += [7] if row == 1 else []
        ids[row, :len(tokens)] = tokens
        mask[row, :len(tokens)] = 1
    return ids, mask


def test_sequence_classification_parity_and_save(classifier_dir, tmp_path):
    """`load_pretrained(dir).logits(ids, mask)` == BartForSequenceClassification's logits
    on a padded batch (the decoder's state at each row's last </s>); saved back as the same
    class with its labels, transformers computes the same logits from it."""
    model, path = classifier_dir
    ids, mask = _pair_rows()
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    loaded = load_pretrained(path)
    assert loaded.architecture == "BartForSequenceClassification"
    ours = loaded.logits(ids, mask)
    diff = np.abs(ours - ref).max()
    print(f"BartForSequenceClassification logits max abs diff {diff:.3g}")
    assert ours.shape == (B, LABELS) and diff < TOL
    save_pretrained(loaded, str(tmp_path))
    reloaded = transformers.BartForSequenceClassification.from_pretrained(str(tmp_path)).eval()
    assert reloaded.config.num_labels == LABELS
    with torch.no_grad():
        again = reloaded(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
    np.testing.assert_array_equal(again, ref)


def test_finetuning_head_starts_from_the_checkpoint(classifier_dir, hf_dirs):
    """t2t's fine-tuning head (`families.head("bart", "classification")`): from the HF
    classifier's tree its loss is transformers' cross entropy; from a
    BartForConditionalGeneration tree the trunk loads (the head starts fresh), its
    predictions on training rows (decoder inputs made by `derived_features`) equal those
    without them."""
    from t2t.models import families
    model, path = classifier_dir
    ids, mask = _pair_rows()
    labels = np.array([0, 2, 1], np.int32)
    batch = {"encoder_input_tokens": ids, "encoder_segment_ids": mask, "label": labels}
    loaded = load_pretrained(path)
    head = families.head("bart", "classification")(loaded.config, LABELS,
                                                   pretrained=loaded.params)
    params = head.init(jax.random.PRNGKey(0), batch)
    loss, metrics = head.loss_fn(params, batch)
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    labels=torch.tensor(labels, dtype=torch.long)).loss.item()
    assert float(loss) == pytest.approx(ref, rel=1e-5)

    lm = load_pretrained(hf_dirs["BartForConditionalGeneration"][1])
    fresh = families.head("bart", "classification")(lm.config, LABELS, pretrained=lm.params)
    params, report = fresh.init_from_pretrained(jax.random.PRNGKey(0), batch, lm.params,
                                                return_report=True)
    assert {p.split("/")[0] for p in report.new} == {"pooler", "classifier"}
    assert report.unused == ["decoder/final_logits_bias/bias"]
    rows = fresh.derived_features(batch)
    np.testing.assert_array_equal(rows["decoder_input_tokens"][:, 1:], ids[:, :-1])
    assert (rows["decoder_input_tokens"][:, 0] == 2).all()
    np.testing.assert_array_equal(np.asarray(fresh.apply(params, rows)),
                                  np.asarray(fresh.apply(params, batch)))


def test_regression_head_is_one_label_bart_classification(tmp_path):
    """t2t's regression head (`families.head("bart", "regression")`, `EosRegressor`) from a
    one-label `BartForSequenceClassification` (problem_type "regression"): its predictions are
    transformers' logits[:, 0], its loss transformers' MSE on float targets, on a padded
    batch; the fine-tuning rows' decoder inputs change nothing."""
    from t2t.models import families
    torch.manual_seed(3)
    settings = {k: v for k, v in _hf_config().to_dict().items()
                if k not in ("id2label", "label2id", "problem_type")}
    model = transformers.BartForSequenceClassification(_hf_config().__class__(
        **settings, num_labels=1, problem_type="regression")).eval()
    assert model.config.num_labels == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(tmp_path, safe_serialization=True)
    ids, mask = _pair_rows()
    target = np.array([0.5, 3.8, -1.25], np.float32)
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long),
                    labels=torch.tensor(target))
    loaded = load_pretrained(tmp_path)
    head = families.head("bart", "regression")(loaded.config, pretrained=loaded.params)
    batch = {"encoder_input_tokens": ids, "encoder_segment_ids": mask, "target": target}
    params, report = head.init_from_pretrained(jax.random.PRNGKey(0), batch, loaded.params,
                                               return_report=True)
    assert report.new == [] and report.reset == []
    pred = np.asarray(head.predict(params, batch))
    assert np.abs(pred - out.logits.numpy()[:, 0]).max() < TOL
    loss, metrics = head.loss_fn(params, head.derived_features(batch))
    assert float(loss) == pytest.approx(out.loss.item(), rel=1e-5)
    assert float(metrics["mae"]) == pytest.approx(np.abs(pred - target).mean(), rel=1e-5)


def test_a_classifier_without_its_head_gets_one_initialised(classifier_dir, tmp_path, caplog):
    """A BartForSequenceClassification checkpoint without its classification_head tensors:
    the trunk loads as the full checkpoint's, the head (3 labels, config.json's) starts
    fresh, named in one log line, as transformers does."""
    from safetensors.numpy import load_file, save_file
    model, _ = classifier_dir
    model.save_pretrained(tmp_path, safe_serialization=True)
    state = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in state.items() if not k.startswith("classification_head.")},
              tmp_path / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level("INFO"):
        loaded = load_pretrained(tmp_path)
    said = [r.getMessage() for r in caplog.records if "initialised" in r.getMessage()]
    assert len(said) == 1 and "BartForSequenceClassification head" in said[0], said
    assert "3 labels from config.json's id2label" in said[0]
    full = load_pretrained(classifier_dir[1]).params
    np.testing.assert_array_equal(loaded.params["decoder"]["layers"]["layer_1"]["mlp"]["wo"]
                                  ["kernel"], full["decoder"]["layers"]["layer_1"]["mlp"]
                                  ["wo"]["kernel"])
    ids, mask = _pair_rows()
    assert loaded.logits(ids, mask).shape == (B, LABELS)
