"""Broken input files through the command line a user would run: every kind of file t2t reads
(plain text, JSONL, TSV, CSV, SQuAD JSON, CoNLL, gin, a Hugging Face config.json, a
SentencePiece .model, a WordPiece vocab.txt), empty, binary garbage, cut mid-record, gzip
trouble (a `.gz` name on plain bytes, gzip bytes without the name) and a 5 MB line.

Each is either a bad-input error (exit 2, one line, no traceback) before anything compiles,
or read with its bad lines skipped and counted: those runs stop where training would start
(`fit` replaced), having said so. A MODEL_DIR that already holds a run keeps its files.
Not here: a 5 MB line in pretraining text (read as one document, fine, but SentencePiece's
training on it alone takes seconds)."""
import gzip
import json
import random

import pytest

from t2t.cli import main
from t2t.data.vocab import SentencePieceVocabulary, WordPieceVocabulary
from t2t.run import experiment, finetune

WORDS = "river stone light water green field house bread salt wind cloud seed door".split()
GARBAGE = bytes(random.Random(0).randrange(256) for _ in range(4000))
HUGE = b"x" * 5_000_000              # one 5 MB line, no newline
FT_T5 = ["finetune", "--gin_file=experiments/finetune_t5_from_files.gin",
         "--gin_file=models/t5/1_1/test.gin", "--gin.BATCH_SIZE=8",
         "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}",
         "--gin.INITIAL_CHECKPOINT=None"]
FT_BERT = ["finetune", "--gin_file=experiments/finetune_bert_from_files.gin",
           "--gin_file=models/bert/test.gin", "--gin.INITIAL_CHECKPOINT=None",
           "--gin.BATCH_SIZE=8"]
PRETRAIN = ["train", "--gin_file=experiments/t5_tiny_bible.gin",
            "--gin_file=models/t5/1_1/test.gin", "--gin.BATCH_SIZE=8",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 8}"]


def _words(i: int, n: int = 4) -> str:
    return " ".join(WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(n))


SQUAD = {"data": [{"paragraphs": [{"context": "ann went to rome", "qas": [
    {"id": str(i), "question": "who went?", "answers": [{"text": "ann", "answer_start": 0}]}
    for i in range(10)]}]}]}
HF_CONFIG = {"model_type": "bert", "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 64}
# kind: (file name, its good content)
GOOD = {
    "text": ("corpus.txt", "".join(f"{_words(i).capitalize()}.\n" for i in range(40)).encode()),
    "jsonl": ("train.jsonl", b"".join(json.dumps({"en": _words(i), "de": _words(i + 1, 2)})
                                      .encode() + b"\n" for i in range(20))),
    "tsv": ("train.tsv", b"en\tde\n" + b"".join(f"{_words(i)}\t{_words(i + 1, 2)}\n".encode()
                                                 for i in range(20))),
    "csv": ("train.csv", b"text,label\n" + b"".join(f"{_words(i)},{'ab'[i % 2]}\n".encode()
                                                      for i in range(20))),
    "squad": ("train.json", json.dumps(SQUAD).encode()),
    "conll": ("train.conll", b"\n\n".join([b"ann B-PER\nwent O\nto O\nrome B-LOC"] * 10) + b"\n"),
    "gin": ("model.gin", b"include 'models/t5/1_1/test.gin'\nTransformerConfig.d_ff = 64\n"),
    "hf_config": ("config.json", json.dumps(HF_CONFIG).encode()),
    "sentencepiece": ("spm.model", None),          # trained in the module fixture
    "wordpiece": ("vocab.txt", None),
}


def _broken(variant: str, good: bytes) -> tuple[str, bytes]:
    """(suffix added to the file name, content)."""
    return {"empty": ("", b""), "garbage": ("", GARBAGE),
            "truncated": ("", good[:len(good) * 2 // 3 + 7]),   # cut inside a record
            "gz_name_plain": (".gz", good), "gz_unnamed": ("", gzip.compress(good)),
            "huge_line": ("", good + HUGE)}[variant]


# (kind, variant): "error: <what the one line says>" | "reads: <what stderr says>" (or "reads")
EXPECTED = {
    ("text", "empty"): "error: hold no text",
    ("text", "garbage"): "error: no usable text in {path} ({path}:1: not UTF-8)",
    ("text", "truncated"): "reads",
    ("text", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("text", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz: rename it",
    ("jsonl", "empty"): "error: no usable line in {path} (the files are empty)",
    ("jsonl", "garbage"): "error: ({path}:1: not UTF-8)",
    ("jsonl", "truncated"): "reads: 1 of the 14 lines of train (7.1%) are bad and skipped; "
                            "the first: {path}:14: not valid JSON",
    ("jsonl", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("jsonl", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz",
    ("jsonl", "huge_line"): "reads: 1 of the 21 lines of train (4.8%) are bad and skipped; "
                            "the first: {path}:21: not valid JSON",
    ("tsv", "empty"): "error: {path} is empty: a TSV file starts with a header row",
    ("tsv", "garbage"): "error: {path}:1: the header row is not UTF-8 text",
    ("tsv", "truncated"): "reads: are bad and skipped; the first: {path}:15: 1 columns, the "
                          "header has 2",
    ("tsv", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("tsv", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz",
    ("tsv", "huge_line"): "reads: 1 of the 21 lines of train (4.8%) are bad and skipped; "
                          "the first: {path}:22: 1 columns, the header has 2",
    ("csv", "empty"): "error: {path} is empty: a CSV file starts with a header row",
    ("csv", "garbage"): "error: {path}:1: the header row is not UTF-8 text",
    ("csv", "truncated"): "reads: are bad and skipped; the first: {path}:15: 1 columns",
    ("csv", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("csv", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz",
    ("csv", "huge_line"): "error: {path}:22: cannot be read as CSV (field larger than field "
                          "limit",
    ("squad", "empty"): "error: {path} is empty: a .json file holds a list of records or "
                        "SQuAD's",
    ("squad", "garbage"): "error: {path} does not start with { or [",
    ("squad", "truncated"): "error: {path}:1: not valid JSON (Unterminated string",
    ("squad", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("squad", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz",
    ("squad", "huge_line"): "error: {path}:1: not valid JSON (Extra data)",
    ("conll", "empty"): "error: no usable line in {path} (the files are empty)",
    ("conll", "garbage"): "error: ({path}:1: not UTF-8)",
    ("conll", "truncated"): "reads",           # cut after a whole token: 7 sentences
    ("conll", "gz_name_plain"): "error: {path} is named .gz but is not gzip-compressed",
    ("conll", "gz_unnamed"): "error: {path} is gzip-compressed but not named .gz",
    ("conll", "huge_line"): "reads: 1 of the 10 lines of train (10.0%) are bad and skipped; "
                            "the first: {path}:50: a token without a tag",
    ("gin", "empty"): "reads",                 # nothing bound: the experiment's defaults
    ("gin", "garbage"): "error: gin file {path}, line 1: not UTF-8 text (byte 0x",
    ("gin", "truncated"): "error: {path}, line 2: Couldn't parse",
    ("gin", "gz_unnamed"): "error: gin file {path}, line 1: gzip-compressed",
    ("gin", "huge_line"): "error: {path}, line 3: Couldn't parse",
    ("hf_config", "empty"): "error: {path}: not valid JSON at line 1, column 1",
    ("hf_config", "garbage"): "error: {path} is not UTF-8 text",
    ("hf_config", "truncated"): "error: {path}: not valid JSON at line 1",
    ("hf_config", "gz_unnamed"): "error: {path} is not UTF-8 text",
    ("hf_config", "huge_line"): "error: {path}: not valid JSON at line 1",
    ("sentencepiece", "empty"): "error: {path} is not a SentencePiece model",
    ("sentencepiece", "garbage"): "error: {path} is not a SentencePiece model",
    ("sentencepiece", "truncated"): "error: {path} is not a SentencePiece model",
    ("sentencepiece", "gz_unnamed"): "error: {path} is not a SentencePiece model",
    ("wordpiece", "empty"): "error: {path} lacks one of [CLS] [SEP] [PAD] [UNK] [MASK]",
    ("wordpiece", "garbage"): "error: {path} cannot be read as a WordPiece vocab.txt",
    ("wordpiece", "truncated"): "reads",       # the special tokens come first
    ("wordpiece", "gz_unnamed"): "error: {path} cannot be read as a WordPiece vocab.txt",
    ("wordpiece", "huge_line"): "reads",       # one long token, never matched
}


class _TrainingStarts(BaseException):
    """Raised by the `fit` stub: the input was read and the run would train now."""


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Good files the cases do not break (the text to pretrain on, a CSV, a vocab.txt), and
    the good content of the vocabularies."""
    root = tmp_path_factory.mktemp("good")
    (root / "corpus.txt").write_bytes(GOOD["text"][1])
    (root / "train.csv").write_bytes(GOOD["csv"][1])
    texts = [_words(i, 6) for i in range(60)] + ["ann went to rome who a b"]
    vocab = WordPieceVocabulary.train(texts, root / "vocab.txt", 120)
    spm = SentencePieceVocabulary.train(texts, root / "spm", 280, extra_ids=0)
    good = {"sentencepiece": open(spm.model_file, "rb").read(),
            "wordpiece": open(vocab.vocab_file, "rb").read()}
    return root, vocab.vocab_file, good


def _argv(kind: str, path: str, model_dir: str, root, vocab: str) -> list:
    """The command a user would run with the file `path` of `kind`."""
    run = [f"--gin.MODEL_DIR={model_dir}"]
    bert_vocab = [f"--gin={e}.vocabulary='{vocab}'" for e in
                  ("classifier_experiment", "tagging_experiment", "span_qa_experiment")]
    if kind == "text":
        return [*PRETRAIN, f"--gin.TEXT_FILES={path}", *run]
    if kind in ("jsonl", "tsv"):
        return [*FT_T5, f"--gin.TRAIN_FILES={path}", "--gin.INPUT_FIELD=en",
                "--gin.TARGET_FIELD=de", *run]
    if kind == "csv":
        return [*FT_BERT, f"--gin.TRAIN_FILES={path}", "--gin.TEXT_FIELD=text",
                "--gin.LABEL_FIELD=label", "--gin.MAX_LENGTH=16", *bert_vocab, *run]
    if kind in ("conll", "squad"):
        return [*FT_BERT, f"--gin.TRAIN_FILES={path}", "--gin.MAX_LENGTH=64", *bert_vocab,
                *run]
    if kind == "gin":
        return [*PRETRAIN[:2], f"--gin_file={path}", *PRETRAIN[3:], *run]
    if kind == "sentencepiece":
        return [*PRETRAIN, f"--gin.TEXT_FILES={root / 'corpus.txt'}", f"--gin.VOCABULARY={path}",
                *run]
    csv_task = [f"--gin.TRAIN_FILES={root / 'train.csv'}", "--gin.TEXT_FIELD=text",
                "--gin.LABEL_FIELD=label", "--gin.MAX_LENGTH=16"]
    if kind == "wordpiece":
        return [*FT_BERT, *csv_task, f"--gin=classifier_experiment.vocabulary='{path}'", *run]
    assert kind == "hf_config"       # a Hugging Face directory to start from
    return [*FT_BERT[:-2], f"--gin.INITIAL_CHECKPOINT={path.rsplit('/', 1)[0]}", "--gin.BATCH_SIZE=8",
            *csv_task, *run]


@pytest.mark.parametrize("kind, variant", sorted(EXPECTED),
                         ids=[f"{k}-{v}" for k, v in sorted(EXPECTED)])
def test_a_broken_file_is_one_line_or_skipped_and_counted(kind, variant, files, tmp_path,
                                                          monkeypatch, capsys):
    root, vocab, good_vocabularies = files
    name, good = GOOD[kind]
    good = good if good is not None else good_vocabularies[kind]
    suffix, content = _broken(variant, good)
    where = tmp_path / "in"
    where.mkdir()
    path = where / (name + suffix)
    path.write_bytes(content)
    if kind == "hf_config":
        (where / "vocab.txt").write_bytes(good_vocabularies["wordpiece"])
    model_dir = tmp_path / "run"                     # a run that is there already
    (model_dir / "checkpoints" / "3" / "state").mkdir(parents=True)
    kept = {model_dir / "checkpoints" / "3" / "state" / "data": b"step 3",
            model_dir / "metrics.jsonl": b'{"step": 3, "loss": 1.0}\n'}
    for file, data in kept.items():
        file.write_bytes(data)

    def training_starts(*args, **kwargs):
        raise _TrainingStarts()

    monkeypatch.setattr(finetune, "fit", training_starts)
    monkeypatch.setattr(experiment, "fit", training_starts)
    argv = _argv(kind, str(path), str(model_dir), root, vocab)
    expected = EXPECTED[kind, variant].replace("{path}", str(path))
    if expected.startswith("reads"):
        with pytest.raises(_TrainingStarts):
            main(argv)
        err = capsys.readouterr().err
        assert "Traceback" not in err and ": error: " not in err, err
        assert expected.removeprefix("reads").removeprefix(": ") in err
    else:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) <= 3 and "Traceback" not in "\n".join(err), err
        assert ": error: " in err[-1] and not any(": error: " in line for line in err[:-1])
        assert expected.removeprefix("error: ") in err[-1], err[-1]
        assert len(err[-1]) < 600                  # a 5 MB line is not echoed
    for file, data in kept.items():
        assert file.read_bytes() == data
