"""transformer_modifications.gin, part B rows (sharing, embeddings, softmaxes, transparent
attention, funnel, product-key memory): every cell builds its tiny model from its gin
lines, and at the paper scale each row has the paper's parameter count."""
import jax
import pytest

from t2t.ablations import grid as grid_lib

PATH = "configs/ablations/transformer_modifications.gin"
PART_B = (
    "Block sharing", "+ Factorized embeddings", "+ Factorized & shared embeddings",
    "Encoder only block sharing", "Decoder only block sharing", "Factorized Embedding",
    "Factorized & shared embeddings", "Tied encoder/decoder input embeddings",
    "Tied decoder input and output embeddings", "Untied embeddings",
    "Adaptive input embeddings", "Adaptive softmax", "Adaptive softmax without projection",
    "Mixture of softmaxes", "Transparent attention", "Dynamic convolution",
    "Lightweight convolution", "Weighted Transformer", "Evolved Transformer",
    "Funnel Transformer", "Product key memory")


def _cells(scale):
    grid = grid_lib.load_grid(PATH, scale, ["T5_VOCABULARY = 'v'"])
    cells = {c.label: c for c in grid.cells}
    assert set(PART_B) <= set(cells)
    return grid, cells


def _model_config(model_gin, lines):
    import gin
    from t2t.run import configurables as configured
    from t2t.run import gin_utils
    gin.clear_config()
    gin_utils.parse([model_gin], ["T5_VOCABULARY = 'v'"] + list(lines))
    return configured.TransformerConfig()


@pytest.mark.slow    # ~20 s; each row's module: tests/nn; each cell's config and first batch: test_grid
def test_every_part_b_cell_builds_its_tiny_model():
    """The tiny model gin, the cell's lines and the 8k Bible vocabulary (8192 rows) give a
    model that initialises (shapes only) on T5 inputs."""
    from t2t.models.families import abstract_params
    _, cells = _cells("tiny")
    for label in PART_B:
        cfg = _model_config("ablations/scales/narang_tiny_model.gin",
                            list(cells[label].pretrain) + ["TransformerConfig.vocab_size = 8192"])
        assert jax.tree_util.tree_leaves(abstract_params("t5", cfg)), label


@pytest.mark.slow
def test_part_b_rows_have_the_papers_parameter_counts():
    """At the paper scale (narang_paper_model.gin: 223M vanilla) every row's parameters are
    within 1.5% of Table 1's Params column (from 20M for block sharing with factorized,
    shared embeddings to 421M for the product-key memory; the Weighted and Evolved
    Transformers' 280M and 217M; the convolutions as the authors ran them, 224M and 257M)."""
    from t2t.models.families import count_params
    grid, cells = _cells("paper")
    counts = {}
    for label in ("Vanilla Transformer",) + PART_B:
        cfg = _model_config("ablations/scales/narang_paper_model.gin", cells[label].pretrain)
        counts[label] = count_params("t5", cfg)
        paper = grid.paper[label][0]
        assert abs(counts[label] / 1e6 - paper) <= max(0.015 * paper, 1.0), (label, paper)
    # the convolutions exactly: attention's q, k, v, o (4 d²) become GLU (2 d²), pointwise
    # (d² + bias) and output (d²); the kernels are per channel, 9 taps (dynamic: predicted
    # by d -> d per tap), and the dynamic row's FFN is 512 wide instead of 3072
    d, k, layers, vanilla = 768, 9, 24, counts["Vanilla Transformer"]
    assert counts["Lightweight convolution"] == vanilla + layers * (d * k + d)
    assert counts["Dynamic convolution"] == (vanilla + layers * (d * d * k + d)
                                             - layers * 2 * d * (3072 - 512))
