"""The part A modifications' parameters (and the Weighted and Evolved Transformer layers')
carry logical axes, as every t2t parameter does."""
import flax.linen as nn
import jax
import pytest

from t2t.nn import EncoderDecoder

from tests.nn.helpers import T5_TINY, tokens
from tests.nn.test_stacks import LOGICAL_NAMES


@pytest.mark.parametrize("changes", [
    dict(residual_scaling="rezero", norm_type="none"),
    dict(residual_scaling="fixup", norm_type="none"),
    dict(synthesizer="dense_plus_alpha", synthesizer_length=8),
    dict(synthesizer="factorized", synthesizer_length=8),
    dict(synthesizer="random_plus", synthesizer_length=8),
    dict(universal_steps=2, universal_act=True),
    dict(linformer_k=3, position_embedding="learned", max_length=8),
    dict(layer_type="weighted"),
    dict(layer_type="evolved"),
], ids=["rezero", "fixup", "dense_plus_alpha", "factorized", "random_plus", "act", "linformer",
        "weighted", "evolved"])
def test_every_parameter_has_logical_axes(changes):
    model = EncoderDecoder(T5_TINY.replace(**changes))
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens(1, (2, 6)),
                                              tokens(2, (2, 4)))["params"])
    leaves = jax.tree_util.tree_leaves(boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    for leaf in leaves:
        assert isinstance(leaf, nn.LogicallyPartitioned), leaf
        assert len(leaf.names) == leaf.value.ndim
        assert set(leaf.names) <= LOGICAL_NAMES, leaf.names
