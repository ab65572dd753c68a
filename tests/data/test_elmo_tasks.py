"""ELMo's Bible tasks (t2t.data.catalog.elmo): verses through the ElmoConverter pipeline,
the word vocabulary, the KJV-or-WEB downstream task."""
import numpy as np

from t2t.data import characters
from t2t.data.catalog import elmo, offline
from t2t.data.tasks import get_task


def test_bible_web_elmo_batches_are_verses_with_their_characters():
    task = get_task("bible_web_elmo")
    vocab = task.vocabulary
    assert len(vocab) == elmo.DEFAULT_WORDS and vocab.padded_vocab_size % 128 == 0
    assert vocab.words[:8] == ["<pad>", "<S>", "</S>", "<UNK>", ",", "the", ".", "and"]
    converter = characters.ElmoConverter({"tokens": 12, "characters": 10})
    batch = next(iter(task.get_pipeline(converter, batch_size=4, seed=0, shuffle=False)))
    assert batch["token_ids"].shape == (4, 12) and batch["char_ids"].shape == (4, 12, 10)
    first = task.source[0]["text"]                                # "In the beginning, ..."
    words = characters.tokenize(first)[:10]
    assert vocab.decode(batch["token_ids"][0]) == ["<S>", *words, "</S>"]
    np.testing.assert_array_equal(batch["char_ids"][0, 1], characters.char_ids(words[0], 10))
    # validation verses come from other chapters
    held = get_task("bible_web_elmo_validation").source
    train_ids = {r["id"].rsplit(".", 1)[0] for r in task.source}
    assert not {r["id"].rsplit(".", 1)[0] for r in held} & train_ids


def test_kjv_or_web_labels_name_the_translation():
    texts, labels = elmo.kjv_or_web("train", limit=400)
    assert len(texts) == 400 and 150 < sum(labels) < 250
    pairs = offline.bible_pairs("kjv", "web", "train")
    for i in range(20):
        assert texts[i] == pairs[i]["kjv" if labels[i] else "web"]
    test_ids = {r["id"] for r in offline.bible_pairs("kjv", "web", "test")}
    assert not test_ids & {pairs[i]["id"] for i in range(400)}
