"""micro_bible_genre_180: every WEB book has a genre, a fixed balanced training sample, and
validation verses only from chapters the micro corpus holds out of pretraining."""
import collections

import pytest

from t2t.data.catalog import bible_genre
from t2t.data.sources import BundledSource
from t2t.data.tasks import registered_tasks


def test_every_book_has_one_genre():
    books = {v["id"].split(".")[0] for v in BundledSource("web", "verse")}
    assert books == set(bible_genre.GENRE_OF)                  # 80 books, none twice
    assert sum(len(b.split()) for b in bible_genre.GENRE_BOOKS.values()) == len(books) == 80
    assert bible_genre.GENRE_OF["Rev"] == "prophecy" and bible_genre.GENRE_OF["Acts"] == "gospel"


def test_validation_is_held_out_of_pretraining_and_train_is_balanced_and_fixed():
    train, validation = bible_genre.records("train"), bible_genre.records("validation")
    assert collections.Counter(v["genre"] for v in train) == {g: 30 for g in bible_genre.GENRES}
    assert len(validation) == 1000 and len({v["id"] for v in validation}) == 1000
    assert all(bible_genre.held_out(v["id"]) for v in validation)
    assert not any(bible_genre.held_out(v["id"]) for v in train)
    assert all(len(v["text"].split()) >= bible_genre.MIN_WORDS for v in train + validation)
    assert len(collections.Counter(v["genre"] for v in validation)) == 6
    bible_genre.records.cache_clear()
    bible_genre._pools.cache_clear()
    assert bible_genre.records("train") == train               # not the run's seed: fixed
    with pytest.raises(ValueError, match="split must be train or validation, not 'test'"):
        bible_genre.records("test")


def test_the_micro_scale_registers_it_and_its_targets_are_the_genre_words():
    assert "micro_bible_genre_180" in registered_tasks()
    example = bible_genre.genre_format({"text": "In the beginning ...", "genre": "law"})
    assert example == {"inputs": "genre: In the beginning ...", "targets": "law", "label": 0}
