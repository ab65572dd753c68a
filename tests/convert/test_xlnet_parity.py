"""XLNet against Hugging Face `XLNetLMHeadModel` (transformers is the reference): tiny random
models (every tensor perturbed) both ways, logits within 1e-5 in float32 for the content
stream, the two-stream path (perm_mask + target_mapping) and a second segment over mems."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core.meta import unbox

import torch  # noqa: E402  (the test extra: never skipped)
import transformers  # noqa: E402  (the test extra: never skipped)

from t2t.convert.hf_xlnet import xlnet_config  # noqa: E402
from t2t.convert.pretrained import (PretrainedError, load_pretrained, pretrained,  # noqa: E402
                                    save_pretrained)
from t2t.models.xlnet import XLNet, XLNetOptions  # noqa: E402
from t2t.nn.two_stream import perm_mask_from_ranks  # noqa: E402
from tests.convert.helpers import perturb  # noqa: E402

TOL = 1e-5
V, B, L = 96, 2, 9
SETTINGS = {
    "bi": dict(mem_len=None),
    # Transformer-XL's causal mode with every position option in use.
    "uni_clamped": dict(attn_type="uni", same_length=True, clamp_len=3, mem_len=4),
}


def _hf(setting):
    torch.manual_seed(0)
    config = transformers.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=64,
                                      dropout=0.0, initializer_range=0.2, **SETTINGS[setting])
    model = transformers.XLNetLMHeadModel(config).eval()
    perturb(model)
    return model


@pytest.fixture(scope="module", params=list(SETTINGS))
def hf_dir(request, tmp_path_factory):
    model = _hf(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path, safe_serialization=True)
    return request.param, model, path


def _batched_mask(setting, mask):
    """HF's "uni" mode cannot add a per-example mask (attention_mask, perm_mask) to its
    causal mask (an in-place add fails to broadcast in transformers 4.57), so only "bi"
    runs take them."""
    return mask if setting == "bi" else None


def _inputs(seed=0, length=L):
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, V, (B, length))
    mask = np.ones((B, length), np.float32)
    mask[1, length - 3:] = 0
    types = np.zeros((B, length), np.int64)
    types[:, length // 2:] = 1
    return ids, mask, types


def _two_stream(seed=1, predict=3):
    """A sampled factorization order per row: HF's perm_mask and one-hot target_mapping of
    its last `predict` positions."""
    rng = np.random.RandomState(seed)
    order = np.stack([rng.permutation(L) for _ in range(B)])
    perm = np.asarray(perm_mask_from_ranks(jnp.asarray(np.argsort(order, 1))))
    mapping = np.zeros((B, predict, L), np.float32)
    mapping[np.arange(B)[:, None], np.arange(predict)[None], order[:, -predict:]] = 1
    return perm, mapping


def _t(x):
    return torch.tensor(x)


def _diff(ours, ref):
    return float(np.abs(np.asarray(ours) - ref).max())


def test_content_stream_logits(hf_dir):
    setting, model, path = hf_dir
    m = load_pretrained(path)
    assert (m.architecture, m.pad_token_id) == ("XLNetLMHeadModel", 5)
    ids, mask, types = _inputs()
    mask = _batched_mask(setting, mask)
    with torch.no_grad():
        ref = model(input_ids=_t(ids), attention_mask=None if mask is None else _t(mask),
                    token_type_ids=_t(types)).logits
    ours = m.logits(ids, mask, types)
    assert ours.shape == (B, L, V)
    print(f"{setting} content stream: max|logit diff| {_diff(ours, ref.numpy()):.3g}")
    assert _diff(ours, ref.numpy()) < TOL


def test_two_stream_and_mems(hf_dir):
    """Segment 1 with perm_mask/target_mapping (query-stream logits, and the mems each layer
    caches), then segment 2 attending those mems."""
    setting, model, path = hf_dir
    m = load_pretrained(path)
    module = XLNet(m.config, m.options)
    ids, mask, types = _inputs()
    perm, mapping = _two_stream()
    perm = _batched_mask(setting, perm)
    with torch.no_grad():
        ref = model(input_ids=_t(ids), token_type_ids=_t(types),
                    perm_mask=None if perm is None else _t(perm),
                    target_mapping=_t(mapping), use_mems=True)
    logits, mems = module.apply({"params": m.params}, jnp.asarray(ids), None,
                                jnp.asarray(types), None if perm is None else jnp.asarray(perm),
                                jnp.asarray(mapping))
    assert logits.shape == (B, 3, V)
    print(f"{setting} two-stream: max|logit diff| {_diff(logits, ref.logits.numpy()):.3g}")
    assert _diff(logits, ref.logits.numpy()) < TOL
    for ours, theirs in zip(mems, ref.mems, strict=True):   # HF: [m, b, d]
        assert _diff(ours, theirs.numpy().transpose(1, 0, 2)) < TOL

    ids2, mask2, types2 = _inputs(seed=2, length=5)
    mask2 = _batched_mask(setting, mask2)
    with torch.no_grad():
        ref2 = model(input_ids=_t(ids2), attention_mask=None if mask2 is None else _t(mask2),
                     token_type_ids=_t(types2), mems=ref.mems, use_mems=True)
    logits2, mems2 = module.apply({"params": m.params}, jnp.asarray(ids2),
                                  None if mask2 is None else jnp.asarray(mask2),
                                  jnp.asarray(types2), mems=mems)
    print(f"{setting} over mems: max|logit diff| {_diff(logits2, ref2.logits.numpy()):.3g}")
    assert _diff(logits2, ref2.logits.numpy()) < TOL
    assert [x.shape[1] for x in mems2] == [t.shape[0] for t in ref2.mems]


def test_save_round_trip(hf_dir, tmp_path):
    """HF -> t2t -> HF: the same tensors, and transformers gives the same logits."""
    setting, model, path = hf_dir
    m = load_pretrained(path)
    save_pretrained(m, tmp_path)
    again = load_pretrained(tmp_path)
    assert (again.config, again.options) == (m.config, m.options)
    jax.tree.map(np.testing.assert_array_equal, again.params, m.params)
    reloaded = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    ids, mask, types = _inputs()
    mask = _batched_mask(setting, mask)
    inputs = dict(input_ids=_t(ids), token_type_ids=_t(types),
                  attention_mask=None if mask is None else _t(mask))
    with torch.no_grad():
        np.testing.assert_array_equal(model(**inputs).logits.numpy(),
                                      reloaded(**inputs).logits.numpy())


def test_t2t_random_weights_to_hf(tmp_path):
    """t2t -> HF: a freshly initialised (then perturbed) t2t XLNet written with
    save_pretrained; transformers reproduces its two-stream logits."""
    config = xlnet_config({"vocab_size": V, "d_model": 32, "n_layer": 2, "n_head": 4,
                           "d_inner": 64, "dropout": 0.0})
    module = XLNet(config, XLNetOptions())
    ids, _, types = _inputs()
    params = unbox(module.init(jax.random.PRNGKey(3), jnp.asarray(ids))["params"])
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
    params = tree.unflatten([x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    save_pretrained(pretrained("xlnet", config, params), tmp_path)
    hf_model = transformers.XLNetLMHeadModel.from_pretrained(tmp_path).eval()
    perm, mapping = _two_stream(seed=5)
    with torch.no_grad():
        ref = hf_model(input_ids=_t(ids), token_type_ids=_t(types), perm_mask=_t(perm),
                       target_mapping=_t(mapping)).logits.numpy()
    ours, _ = module.apply({"params": params}, jnp.asarray(ids), None, jnp.asarray(types),
                           jnp.asarray(perm), jnp.asarray(mapping))
    print(f"t2t -> HF two-stream: max|logit diff| {_diff(ours, ref):.3g}")
    assert _diff(ours, ref) < TOL


def test_unsupported_settings_are_one_line_errors(tmp_path):
    model = _hf("bi")
    model.save_pretrained(tmp_path, safe_serialization=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, bi_data=True)))
    with pytest.raises(PretrainedError, match="bi_data=True") as e:
        load_pretrained(tmp_path)
    assert "\n" not in str(e.value)
