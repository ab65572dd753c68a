"""Shared by the tests of an HF classifier directory scored by `t2t eval` and continued by
`t2t finetune`."""
import csv
import json

import numpy as np
import pytest
import tokenizers
import torch
import transformers as t

from t2t.cli import main

LENGTH, TRAIN, TEST = 40, 16, 6     # the first batch is the whole training split
LABELS = ["calm", "storm"]
WORDS = ("the Lord said to them and he went into house of God people king land day "
         "came all Israel son").split()


def sentence(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


def write_pair_task(root, fast, extra_flags=()):
    """train/test CSVs of sentence pairs (short enough that no row is cut) under `root`;
    returns the rows and the flags of a 1-step classifier fine-tuning on them (`fast`: gin
    bindings, `extra_flags`: more flags)."""
    rows = [(sentence(i, 5), sentence(i + 11, 4), LABELS[i % 3 == 0])
            for i in range(TRAIN + TEST)]
    for name, part in (("train", rows[:TRAIN]), ("test", rows[TRAIN:])):
        with open(root / f"{name}.csv", "w", newline="") as f:
            csv.writer(f).writerows([("text", "text2", "label"), *part])
    flags = ["--gin_file=experiments/finetune_bert_from_files.gin",
             f"--gin.TRAIN_FILES={root}/train.csv", f"--gin.TEST_FILES={root}/test.csv",
             "--gin.TEXT_FIELD=text", "--gin.TEXT_PAIR_FIELD=text2",
             "--gin.LABEL_FIELD=label", "--gin.EPOCHS=None", "--gin.TRAIN_STEPS=1",
             f"--gin.MAX_LENGTH={LENGTH}", f"--gin.BATCH_SIZE={TRAIN}", *extra_flags,
             *[f"--gin={b}" for b in fast]]
    return rows, flags


def check_eval_and_finetune(flags, tmp_path, labels, test_labels, test_logits, train_labels,
                            train_logits):
    """`t2t eval` of MODEL_DIR without checkpoints scores the HF directory named by `flags`'
    INITIAL_CHECKPOINT: its test predictions are transformers' argmax of `test_logits` and
    its accuracy theirs against `test_labels`; `t2t finetune`'s first logged loss is
    transformers' cross entropy of `train_logits` against `train_labels` (rel. 1e-5).
    Returns the test argmax."""
    scored = tmp_path / "scored"            # no checkpoints: the HF directory is scored
    assert main(["eval", *flags, f"--gin.MODEL_DIR={scored}"]) == 0
    assert json.loads((scored / "labels.json").read_text())["labels"] == labels
    predictions = [json.loads(line) for line in open(scored / "predictions.jsonl")]
    argmax = test_logits.argmax(-1).tolist()
    assert [p["prediction"] for p in predictions if p["split"] == "test"] == \
        [labels[i] for i in argmax]
    accuracy = 100 * np.mean([labels[i] == y for i, y in zip(argmax, test_labels)])
    metrics = json.loads((scored / "metrics.json").read_text())
    assert metrics["from_files/test"]["accuracy"] == pytest.approx(accuracy)

    tuned = tmp_path / "tuned"
    assert main(["finetune", *flags, f"--gin.MODEL_DIR={tuned}"]) == 0
    first = json.loads(open(tuned / "metrics.jsonl").readline())
    loss = torch.nn.functional.cross_entropy(
        train_logits, torch.tensor([labels.index(y) for y in train_labels]))
    assert first["step"] == 1
    assert first["loss"] == pytest.approx(float(loss), rel=1e-5)
    return argmax


def hf_pair_logits(model, tokenizer, rows):
    """transformers' logits of the (text, text2) `rows` padded to LENGTH (none cut)."""
    batch = tokenizer([r[0] for r in rows], [r[1] for r in rows], padding="max_length",
                      max_length=LENGTH, return_tensors="pt")
    assert int(batch["attention_mask"].sum(-1).max()) < LENGTH     # nothing was cut
    with torch.no_grad():
        return model(**batch).logits


def save_classifier(path, model, tokenizer, output, test_rows):
    """Saves the tokenizer and the classifier `model` to `path` with its `output` layer's
    bias centred on the test rows (so both labels are predicted); returns AutoTokenizer of
    the saved directory."""
    tokenizer.save_pretrained(str(path))
    tokenizer = t.AutoTokenizer.from_pretrained(str(path))
    with torch.no_grad():
        output.bias -= hf_pair_logits(model, tokenizer, test_rows).median(0).values
    model.save_pretrained(path, safe_serialization=True)
    return tokenizer


def byte_bpe_tokenizer(path, lines, cls):
    """A byte-level BPE of 600 ids trained on `lines` (<s> <pad> </s> <unk> <mask> = 0..4,
    RoBERTa's and BART's) as the transformers tokenizer class `cls`, its files beside
    `path`."""
    trained = tokenizers.ByteLevelBPETokenizer()
    trained.train_from_iterator(lines, vocab_size=600, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    files = path.parent / f"{path.name}_bpe"
    files.mkdir()
    trained.save_model(str(files))
    return cls(vocab_file=str(files / "vocab.json"), merges_file=str(files / "merges.txt"))
