"""XLNet fine-tuning heads against Hugging Face (transformers is the reference):
`XLNetForSequenceClassification` and `XLNetForMultipleChoice`, tiny random models (every
tensor perturbed) both ways through load_pretrained / save_pretrained, logits within 1e-5 in
float32 on left-padded inputs in XLNet's layout (the [CLS] last, segment id 2)."""
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
from t2t.models.xlnet import XLNetOptions  # noqa: E402
from t2t.models.xlnet_heads import XLNetClassifierHead  # noqa: E402
from tests.convert.helpers import perturb  # noqa: E402

TOL = 1e-5
V, B, C, L, LABELS = 96, 3, 2, 10, 3
HEADS = {"XLNetForSequenceClassification": LABELS, "XLNetForMultipleChoice": 1}


def _hf_config(**kw):
    return transformers.XLNetConfig(vocab_size=V, d_model=32, n_layer=2, n_head=4, d_inner=64,
                                    dropout=0.0, summary_last_dropout=0.0, mem_len=None,
                                    initializer_range=0.2, **kw)


def _rows(seed, shape):
    """XLNet-layout rows [..., L]: left padding (pad id 5, type 4), segments A 0 / B 1,
    the [CLS] (id 3, type 2) last; row lengths L, L-3 and 4."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(6, V, shape + (L,))
    mask = np.ones(shape + (L,), np.float32)
    types = np.zeros(shape + (L,), np.int64)
    flat_ids, flat_mask, flat_types = (x.reshape(-1, L) for x in (ids, mask, types))
    for row in range(flat_ids.shape[0]):
        n = (L, L - 3, 4)[row % 3]
        flat_mask[row, :L - n] = 0
        flat_ids[row, :L - n] = 5
        flat_types[row, :L - n] = 4
        flat_types[row, L - n + n // 2:] = 1
        flat_ids[row, -1], flat_types[row, -1] = 3, 2
    return ids, mask, types


def _inputs(architecture, seed=0):
    return _rows(seed, (B, C) if architecture == "XLNetForMultipleChoice" else (B,))


def _hf_logits(model, ids, mask, types):
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types)).logits.numpy()


@pytest.fixture(scope="module", params=list(HEADS))
def hf_dir(request, tmp_path_factory):
    architecture = request.param
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(_hf_config(num_labels=LABELS)).eval()
    perturb(model)
    path = tmp_path_factory.mktemp(architecture)
    model.save_pretrained(path, safe_serialization=True)
    return architecture, model, path


def test_hf_to_t2t_logits(hf_dir):
    architecture, model, path = hf_dir
    m = load_pretrained(path)
    assert m.architecture == architecture
    ids, mask, types = _inputs(architecture)
    ours, ref = m.logits(ids, mask, types), _hf_logits(model, ids, mask, types)
    assert ours.shape == ref.shape == ((B, C) if HEADS[architecture] == 1 else (B, LABELS))
    diff = float(np.abs(ours - ref).max())
    print(f"{architecture} HF -> t2t: max|logit diff| {diff:.3g}")
    assert diff < TOL


def test_save_round_trip(hf_dir, tmp_path):
    """HF -> t2t -> HF: the same tensors and architecture (logits agree to float32
    rounding: torch's kernels need not sum in the same order on two model objects)."""
    architecture, model, path = hf_dir
    m = load_pretrained(path)
    save_pretrained(m, tmp_path)
    again = load_pretrained(tmp_path)
    assert (again.architecture, again.config, again.options) == (
        architecture, m.config, m.options)
    jax.tree.map(np.testing.assert_array_equal, again.params, m.params)
    reloaded = getattr(transformers, architecture).from_pretrained(tmp_path).eval()
    theirs, again_hf = model.state_dict(), reloaded.state_dict()
    assert set(theirs) == set(again_hf)
    for name, tensor in theirs.items():
        torch.testing.assert_close(again_hf[name], tensor, rtol=0, atol=0)
    ids, mask, types = _inputs(architecture, seed=1)
    np.testing.assert_allclose(_hf_logits(reloaded, ids, mask, types),
                               _hf_logits(model, ids, mask, types), rtol=0, atol=1e-6)


@pytest.mark.parametrize("architecture", list(HEADS))
def test_t2t_random_weights_to_hf(architecture, tmp_path):
    """t2t -> HF: a freshly initialised (then perturbed) head written by save_pretrained;
    transformers reproduces its logits."""
    config = xlnet_config({"vocab_size": V, "d_model": 32, "n_layer": 2, "n_head": 4,
                           "d_inner": 64, "dropout": 0.0})
    options = XLNetOptions(summary_last_dropout=0.0)
    module = XLNetClassifierHead(config, HEADS[architecture], options)
    ids, mask, types = _inputs(architecture, seed=2)
    params = unbox(module.init(jax.random.PRNGKey(3), jnp.asarray(ids))["params"])
    assert "lm_bias" not in params["transformer"]
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(4), len(leaves))
    params = tree.unflatten([x + 0.1 * jax.random.normal(k, x.shape)
                             for x, k in zip(leaves, keys)])
    save_pretrained(pretrained("xlnet", config, params, architecture, options=options), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [architecture]
    hf_model = getattr(transformers, architecture).from_pretrained(tmp_path).eval()
    ours = module.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                        jnp.asarray(types))
    diff = float(np.abs(np.asarray(ours) - _hf_logits(hf_model, ids, mask, types)).max())
    print(f"{architecture} t2t -> HF: max|logit diff| {diff:.3g}")
    assert diff < TOL


def test_unsupported_summary_is_a_one_line_error(tmp_path):
    model = transformers.XLNetForSequenceClassification(
        _hf_config(num_labels=2, summary_type="mean"))
    model.save_pretrained(tmp_path, safe_serialization=True)
    with pytest.raises(PretrainedError, match="summary_type") as e:
        load_pretrained(tmp_path)
    assert "\n" not in str(e.value)
