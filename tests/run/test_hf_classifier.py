"""A Hugging Face classifier directory (a tiny random `BertForSequenceClassification`)
through the command line on a tiny CSV task: `t2t eval` scores it as it is (its
predictions are transformers' argmax on the same rows), `t2t finetune` continues from its
head (the first step's loss is transformers' loss on that batch); one with another label
count gets a fresh head, said in one log line, so `t2t eval` refuses to score it."""
import csv
import os

import numpy as np
import pytest
import torch
import transformers as t

from t2t.cli import main
from tests.run.helpers import check_eval_and_finetune
from t2t.data.vocab import WordPieceVocabulary
from tests.convert.helpers import perturb

FAST = ["TrainConfig.log_every = 1", "TrainConfig.progress_bar = False",
        "TrainConfig.async_checkpoint = False", "TrainConfig.measure_peak = False"]
WORDS = ("river stone light water green field house bread salt wind cloud seed door road "
         "hill tree").split()
LENGTH, TRAIN = 16, 24        # the first batch is the whole training split (24 rows)
LABELS = ["calm", "storm"]    # the task's label ids (labels.json)


def _sentence(i: int, n: int = 5) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """train/test CSVs, a WordPiece trained on them, and the command's flags."""
    root = tmp_path_factory.mktemp("hf_classifier")
    rows = [(_sentence(i), LABELS[i % 3 == 0]) for i in range(TRAIN + 6)]
    for name, part in (("train", rows[:TRAIN]), ("test", rows[TRAIN:])):
        with open(root / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([("text", "label"), *part])
    vocab = WordPieceVocabulary.train([r[0] for r in rows], root / "vocab.txt", 200)
    flags = ["--gin_file=experiments/finetune_bert_from_files.gin",
             f"--gin.TRAIN_FILES={root}/train.csv", f"--gin.TEST_FILES={root}/test.csv", "--gin.TEXT_FIELD=text",
             "--gin.LABEL_FIELD=label", "--gin.EPOCHS=None", "--gin.TRAIN_STEPS=1",
             f"--gin.MAX_LENGTH={LENGTH}", f"--gin.BATCH_SIZE={TRAIN}",
             *[f"--gin={b}" for b in FAST]]
    return root, rows, vocab, flags


def _hf_classifier(path, vocab, num_labels):
    """A tiny random BertForSequenceClassification (no dropout) with the task's vocab.txt."""
    torch.manual_seed(0)
    config = t.BertConfig(vocab_size=vocab.vocab_size, hidden_size=32, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=64, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0, max_position_embeddings=LENGTH,
                          num_labels=num_labels, initializer_range=0.2)
    model = t.BertForSequenceClassification(config).eval()
    perturb(model, 0.3)
    model.save_pretrained(path, safe_serialization=True)
    (path / "vocab.txt").write_text((vocab.vocab_file and open(vocab.vocab_file).read()))
    return model


def _rows(vocab, texts):
    """[CLS] text [SEP] cut to LENGTH, as the pipeline makes them: (ids, mask)."""
    ids = np.full((len(texts), LENGTH), vocab.pad_id, np.int64)
    for row, toks in enumerate(vocab.encode_batch(texts, add_special_tokens=False)):
        pieces = [vocab.cls_id] + list(toks[:LENGTH - 2]) + [vocab.sep_id]
        ids[row, :len(pieces)] = pieces
    return ids, (ids != vocab.pad_id).astype(np.int64)


def _hf_logits(model, vocab, texts):
    ids, mask = _rows(vocab, texts)
    with torch.no_grad():
        return model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits


def test_eval_scores_it_and_finetune_continues_from_its_head(data, tmp_path):
    root, rows, vocab, flags = data
    model = _hf_classifier(tmp_path / "hf", vocab, len(LABELS))
    flags = [*flags, f"--gin.INITIAL_CHECKPOINT={tmp_path / 'hf'}"]

    train, test = rows[:TRAIN], rows[TRAIN:]
    check_eval_and_finetune(flags, tmp_path, LABELS, [r[1] for r in test],
                            _hf_logits(model, vocab, [r[0] for r in test]),
                            [r[1] for r in train],
                            _hf_logits(model, vocab, [r[0] for r in train]))


def test_another_label_count_is_refused_by_eval_its_head_initialised_fresh(
        data, tmp_path, capsys):
    root, rows, vocab, flags = data
    _hf_classifier(tmp_path / "hf3", vocab, 3)
    flags = [*flags, f"--gin.INITIAL_CHECKPOINT={tmp_path / 'hf3'}",
             f"--gin.MODEL_DIR={tmp_path / 'run'}"]
    assert main(["eval", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    said = [line for line in err if "does not fit" in line]
    assert said == ["the pretrained head does not fit this task, initialised fresh: "
                    "classifier/dense/bias (3,) -> (2,), "
                    "classifier/dense/kernel (32, 3) -> (32, 2)"]
    errors = [line for line in err if line.startswith("t2t eval: error:")]
    assert len(errors) == 1 and "has no head for this task (classifier would be new)" \
        in errors[0]
    assert not os.path.exists(tmp_path / "run" / "checkpoints")
