"""gin builders of your own data: `text_corpus` (pretraining corpus) and `files_task`
(a fine-tuning task) register tasks over your files (`t2t.data.user_tasks`) and return their
names for `experiment.corpus` / `*_experiment.task`; `saved_wordpiece` finds the vocab.txt a
BERT run on your text saved (configs/experiments/*_from_files.gin, configs/runs/*)."""
from __future__ import annotations

import os
from typing import Any

import gin

from t2t.data import tasks as tasks_lib
from t2t.data import vocab_training
from t2t.data.catalog.bible import bible_sentencepiece
from t2t.data.streaming import CYCLE_LENGTH, SHUFFLE_BUFFER, TextStream
from t2t.data.user_tasks import (TEXT_CORPUS, VOCAB_SAMPLE_CHARS, from_files, read_labels,
                                 save_labels, text_files_tasks, text_vocabulary)
from t2t.models import families
from t2t.run.configurables import configurable



@configurable
def text_corpus(text_files: Any = None, default: str = "bible_web", text_field: str = "text",
                vocabulary: str | None = None, family: str = gin.REQUIRED,
                model_dir: str | None = None, vocab_size: int = 8000,
                documents: str = "paragraphs", shuffle_buffer: int = SHUFFLE_BUFFER,
                cycle_length: int = CYCLE_LENGTH,
                vocab_sample_chars: int = VOCAB_SAMPLE_CHARS) -> str:
    """`experiment.corpus` for pretraining: ``default`` (the bundled Bible) when
    ``text_files`` is None, else ``text_files`` read as a stream (`TextStream`: each host
    its own shards, ``shuffle_buffer`` documents shuffled, ``cycle_length`` files read in
    turn): tasks over them (`text_files_tasks`) registered with a vocabulary given or
    trained on a sample of ``vocab_sample_chars`` characters, which is saved in
    ``model_dir`` for fine-tuning to find."""
    if not text_files:
        return default
    stream = TextStream(text_files, text_field, documents, shuffle_buffer=shuffle_buffer,
                        cycle_length=cycle_length)
    stream.first()                     # a corpus with no text: one line now
    # the family's own kind where t2t trains it (BERT and its successors: WordPiece), else
    # SentencePiece (T5, GPT: byte-level BPE is not trained here)
    kind = "wordpiece" if families.get(family).tokenizer == "wordpiece" else "sentencepiece"
    vocab = text_vocabulary(stream, kind, vocabulary, vocab_size, vocab_sample_chars)
    for task in text_files_tasks(stream, vocab):
        tasks_lib.register_task(task, overwrite=True)
    if model_dir:
        import jax
        if jax.process_index() == 0:
            vocab_training.save(vocab, model_dir)
    return TEXT_CORPUS


@configurable
def files_task(train_files: Any = gin.REQUIRED, validation_files: Any = None,
               test_files: Any = None, input_field: str | None = None,
               target_field: str | None = None, text_field: str | None = None,
               text_pair_field: str | None = None, label_field: str | None = None,
               task_prefix: str | None = None, metrics: Any = None,
               model_dir: str | None = None, initial_checkpoint: str | None = None) -> str:
    """`from_files` registered as a task; its name. Text is tokenized with the vocabulary
    saved in ``initial_checkpoint`` (a pretraining on your text), else the bundled Bible's
    SentencePiece; the label set comes from ``model_dir``/labels.json when a run made it
    already (so `t2t eval` and a resumed run keep the ids), else from the training files
    and is saved there."""
    vocabulary = vocab_training.saved(initial_checkpoint) or bible_sentencepiece
    labels = read_labels(model_dir)
    task = from_files(train_files, validation_files, test_files, input_field=input_field,
                      target_field=target_field, text_field=text_field,
                      text_pair_field=text_pair_field, label_field=label_field,
                      task_prefix=task_prefix, metrics=metrics, vocabulary=vocabulary,
                      labels=labels, name="from_files")
    tasks_lib.register_task(task, overwrite=True)
    if model_dir and labels is None and task.label_names:
        import jax
        if jax.process_index() == 0:
            save_labels(model_dir, task.label_names, task.kind)
    return task.name


@configurable
def saved_wordpiece(model_dir: str | None = None) -> str | None:
    """MODEL_DIR/vocab.txt of a BERT pretrained on your text (or a Hugging Face
    directory's), for `classifier_experiment.vocabulary`; None when there is none."""
    path = os.path.join(model_dir or "", vocab_training.SAVED_WORDPIECE)
    return path if model_dir and os.path.isfile(path) else None
