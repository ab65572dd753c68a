"""Preset gin configs build the published architectures (parameter counts)."""
import pytest

from t2t.run import gin_utils
from t2t.models.families import count_params
from t2t.run.configurables import TransformerConfig


def params_of(gin_file):
    gin_utils.parse([gin_file])
    return count_params(gin_utils.query_macro("MODEL_FAMILY"), TransformerConfig())


# Published sizes (papers / model cards) and the exact count of the released checkpoints'
# tensors that t2t's tree holds (BERT: BertForPreTraining incl. MLM + NSP heads).
@pytest.mark.parametrize("gin_file,published,exact", [
    ("models/bert/base.gin", 110e6, 110_106_428),
    ("models/t5/1_1/base.gin", 248e6, 247_577_856),
    ("models/t5/1_0/base.gin", 220e6, 222_903_552),
    ("models/gpt2/small.gin", 124e6, 124_439_808),
    ("models/gpt2/medium.gin", 355e6, 354_823_168),
])
def test_parameter_counts_match_published(gin_file, published, exact):
    n = params_of(gin_file)
    assert n == exact
    assert abs(n - published) / published < 0.015


def test_bert_large_matches_the_released_checkpoint():
    # The paper rounds BERT-large to "340M"; the released checkpoint (BertModel 335,141,888
    # + MLM head 1,082,170 + NSP 2,050) is 1.1% smaller, and so is t2t's.
    assert params_of("models/bert/large.gin") == 335_141_888 + 1_082_170 + 2_050


def test_test_variants_are_tiny():
    for f in ["models/bert/test.gin", "models/t5/1_1/test.gin", "models/t5/1_0/test.gin",
              "models/gpt2/test.gin"]:
        assert params_of(f) < 200_000, f
