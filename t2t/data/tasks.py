"""Task registry: a Task = source + per-record preprocessors + vocabulary + metrics.

A preprocessor maps one example to an example, a list of them, or None (dropped), and
declares the keyword arguments it needs among ``seed``, ``vocabulary`` and
``sequence_length`` (as seqio does). Step ``i`` applied to the ``j``-th example of a record
gets the seed ``(*record_seed, i, j)``, so every random choice is reproducible.
Vocabularies are objects or zero-argument callables resolved on first use. This module
registers nothing itself: the named tasks are defined in `t2t.data.catalog`, which
`get_task` and `registered_tasks` import on first use.
"""
from __future__ import annotations

import collections
import collections.abc
import difflib
import functools
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from t2t.data import bart_noising
from t2t.data import preprocessors as prep
from t2t.data.converters import FeatureConverter
from t2t.data.pipeline import BatchIterator, make_mixture_pipeline, make_pipeline
from t2t.data.preprocessors import SkipExample
from t2t.data.sources import RandomAccessSource
from t2t.data.vocab import word_pieces
from t2t.errors import UserError

_PASSED = ("seed", "vocabulary", "sequence_length")


def _wants(fn: Callable) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return ()
    return tuple(name for name in _PASSED if name in params)


class Task:
    """A named pretraining or fine-tuning task."""

    def __init__(self, name: str, source_fn: Callable[[], RandomAccessSource],
                 preprocessors: Sequence[Callable], vocabulary: Any = None,
                 metric_fns: Sequence[Callable] = (), description: str = ""):
        self.name, self.source_fn = name, source_fn
        self.preprocessors = tuple(preprocessors)
        self.metric_fns = tuple(metric_fns)
        self.description = description
        self._vocabulary = vocabulary
        self._source: RandomAccessSource | None = None
        self._wants = [_wants(fn) for fn in self.preprocessors]

    def __repr__(self) -> str:
        return f"Task({self.name!r})"

    @property
    def vocabulary(self) -> Any:
        """The vocabulary, built on first access when given as a callable."""
        if callable(self._vocabulary) and not hasattr(self._vocabulary, "encode"):
            self._vocabulary = self._vocabulary()
        return self._vocabulary

    @property
    def built_vocabulary(self) -> Any:
        """The vocabulary if it was given or has been built, else None (never builds one)."""
        vocab = self._vocabulary
        return None if callable(vocab) and not hasattr(vocab, "encode") else vocab

    @property
    def source(self) -> RandomAccessSource:
        if self._source is None:
            self._source = self.source_fn()
        return self._source

    def preprocess(self, record: Any, seed: Sequence[int],
                   sequence_length: dict[str, int] | None = None) -> list[dict]:
        """All preprocessors applied to one record: the list of examples it yields."""
        examples = [record]
        for step, (fn, wants) in enumerate(zip(self.preprocessors, self._wants)):
            out: list = []
            for j, example in enumerate(examples):
                kwargs = {}
                if "seed" in wants:
                    kwargs["seed"] = (*seed, step, j)
                if "vocabulary" in wants:
                    kwargs["vocabulary"] = self.vocabulary
                if "sequence_length" in wants:
                    kwargs["sequence_length"] = sequence_length
                result = fn(example, **kwargs)
                if result is None:
                    continue
                out.extend([result] if isinstance(result, dict) else result)
            examples = out
        return examples

    def get_pipeline(self, converter: FeatureConverter, batch_size: int, seed: int,
                     **kwargs) -> BatchIterator:
        """``make_pipeline`` over this task; ``kwargs`` as there (shuffle, num_epochs, ...)."""
        self.vocabulary  # resolve once here, not in every worker
        return make_pipeline(self.source, TaskFn(self, converter.lengths), converter,
                             batch_size, seed, **kwargs)


class TaskFn:
    """Picklable ``(record, seed) -> examples`` for the pipeline."""

    def __init__(self, task: Task, sequence_length: dict[str, int]):
        self.task, self.sequence_length = task, sequence_length

    def __call__(self, record: Any, seed: tuple[int, ...]) -> list[dict]:
        return self.task.preprocess(record, seed, self.sequence_length)


class Mixture:
    """Tasks interleaved deterministically in proportion to their rates."""

    def __init__(self, name: str, tasks: Sequence[tuple[Task | str, float]]):
        if not tasks or any(rate <= 0 for _, rate in tasks):
            raise ValueError("a mixture needs tasks with positive rates")
        self.name, self._tasks = name, list(tasks)

    def __repr__(self) -> str:
        return f"Mixture({self.name!r}, {[(t.name, r) for t, r in self.tasks]})"

    @property
    def tasks(self) -> list[tuple[Task, float]]:
        return [(get_task(t) if isinstance(t, str) else t, float(r)) for t, r in self._tasks]

    def get_pipeline(self, converter: FeatureConverter, batch_size: int, seed: int,
                     **kwargs) -> BatchIterator:
        components = []
        for task, rate in self.tasks:
            task.vocabulary
            components.append((task.source, TaskFn(task, converter.lengths), rate))
        return make_mixture_pipeline(components, converter, batch_size, seed, **kwargs)


_REGISTRY: dict[str, Task | Mixture] = {}


class TaskNotFoundError(UserError, KeyError):
    """An unknown task name; the message lists close matches and every registered name."""


def register_task(task: Task | Mixture, overwrite: bool = False) -> Task | Mixture:
    """Adds a task (or mixture) under its name; a taken name is an error unless ``overwrite``."""
    if task.name in _REGISTRY and not overwrite:
        raise ValueError(f"task {task.name!r} is already registered")
    _REGISTRY[task.name] = task
    return task


def register_mixture(name: str, tasks: Sequence[tuple[Task | str, float]],
                     overwrite: bool = False) -> Mixture:
    return register_task(Mixture(name, tasks), overwrite)  # type: ignore[return-value]


def remove_task(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load_catalog() -> None:
    """Register the catalogue's tasks (`t2t.data.catalog`; once, on first lookup)."""
    import t2t.data.catalog  # noqa: F401


def registered_tasks() -> list[str]:
    _load_catalog()
    return sorted(_REGISTRY)


def get_task(name: str) -> Task | Mixture:
    """The registered task or mixture; an unknown name lists close matches and all names."""
    _load_catalog()
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise TaskNotFoundError(
            f"unknown task {name!r}.{hint} Registered: {', '.join(sorted(_REGISTRY))}") from None


# ----------------------------------------------------------------------------- preprocessors


def tokenize(example: Any, *, vocabulary: Any, field: str = "text") -> dict:
    """Text (a str/bytes record or ``example[field]``) -> ``{"tokens": int32[n]}``."""
    text = example[field] if isinstance(example, dict) else example
    tokens = np.asarray(vocabulary.encode(prep.decode_text(text)), np.int32)
    if len(tokens) == 0:
        raise SkipExample("empty")
    return {"tokens": tokens}


def split_for_span_corruption(example: dict, *, sequence_length: dict[str, int],
                              noise_density: float = 0.15, mean_noise_span_length: float = 3.0
                              ) -> list[dict]:
    """Chunks of T5's raw length for ``sequence_length["inputs"]`` (568 for 512)."""
    raw_length, _ = prep.span_corruption_lengths(sequence_length["inputs"], noise_density,
                                                 mean_noise_span_length)
    return [{"tokens": t} for t in prep.split_tokens(example["tokens"], raw_length)]


def split_to_length(example: dict, *, sequence_length: dict[str, int], feature: str = "inputs",
                    reserve: int = 1) -> list[dict]:
    """Chunks of ``sequence_length[feature] - reserve`` tokens (room for EOS)."""
    return [{"tokens": t}
            for t in prep.split_tokens(example["tokens"], sequence_length[feature] - reserve)]


def span_corruption(example: dict, *, seed, vocabulary: Any, noise_density: float = 0.15,
                    mean_noise_span_length: float = 3.0) -> dict:
    """T5 span corruption with ``<extra_id_0>`` (= vocab_size - 1) as the first sentinel."""
    return prep.span_corruption(example["tokens"], seed=seed, sentinel_id=_sentinel(vocabulary),
                                noise_density=noise_density,
                                mean_noise_span_length=mean_noise_span_length,
                                eos_id=vocabulary.eos_id)


def denoise_objective(example: dict, *, seed, vocabulary: Any, objective: str) -> dict:
    """Any T5-gin-named objective (``iid_15_m_f``, ``all_permute``...) on ``tokens``."""
    fn = prep.objective(objective, sentinel_id=_sentinel(vocabulary),
                        vocab_size=vocabulary.vocab_size, eos_id=vocabulary.eos_id,
                        special_ids=(vocabulary.pad_id, vocabulary.eos_id, vocabulary.unk_id))
    return fn(example["tokens"], seed)


def bart_objective(example: dict, *, seed, vocabulary: Any, objective: str) -> dict:
    """A BART noising objective (``bart_text_infilling``...: `t2t.data.bart_noising`) on
    ``tokens``, the mask token ``<extra_id_0>`` (or the last id) as for MASS-style."""
    fn = bart_noising.objective(objective, mask_id=_sentinel(vocabulary),
                                sentence_end_ids=bart_noising.sentence_end_ids(vocabulary),
                                eos_id=vocabulary.eos_id)
    return fn(example["tokens"], seed)


def lm_chunks(example: dict, *, vocabulary: Any, sequence_length: dict[str, int]) -> list[dict]:
    """T5 ``full_lm``: document + EOS, split into ``targets``-length chunks."""
    tokens = prep.append_eos(example["tokens"], vocabulary.eos_id)
    return [{"targets": t} for t in prep.split_tokens(tokens, sequence_length["targets"])]


def prefix_lm_chunks(example: dict, *, seed, vocabulary: Any, sequence_length: dict[str, int]
                     ) -> list[dict]:
    """T5 ``prefix_lm``: chunks that fill inputs+targets (with two EOS), split at random."""
    length = sequence_length["inputs"] + sequence_length["targets"] - 2
    chunks = prep.split_tokens(example["tokens"], length)
    return [prep.prefix_lm_split(c, (*seed, k), eos_id=vocabulary.eos_id)
            for k, c in enumerate(chunks) if len(c) >= 2]


def _sentinel(vocabulary: Any) -> int:
    if hasattr(vocabulary, "sentinel_id"):
        return int(vocabulary.sentinel_id(0))
    return int(vocabulary.vocab_size) - 1


def documents_word_pieces(records: Sequence[dict], vocabulary: Any, sentences_key: str
                           ) -> list[list[tuple[list[int], list[bool]]]]:
    """Each record's `sentences_key` sentences as `word_pieces` (ids, word starts), the whole
    corpus in batched tokenizer calls."""
    sentences = [list(record[sentences_key]) for record in records]
    pieces = iter(word_pieces(vocabulary, [s for doc in sentences for s in doc]))
    return [[next(pieces) for _ in doc] for doc in sentences]


class LazyDocuments(collections.abc.Sequence):
    """``source``'s records as tokenised documents, each tokenised on first use (an LRU of
    ``cache_size``): a corpus too large to tokenise up front (Wikipedia) still gives BERT's
    NSP its random B documents. ``tokens[i]`` and ``starts[i]`` are the two views."""

    def __init__(self, source: Any, vocabulary: Any, sentences_key: str,
                 cache_size: int = 4096):
        self.source, self.vocabulary, self.sentences_key = source, vocabulary, sentences_key
        self._get = functools.lru_cache(maxsize=cache_size)(self._tokenize)
        self.tokens = _View(self, 0)
        self.starts = _View(self, 1)

    def _tokenize(self, i: int) -> tuple[list, list]:
        pieces = word_pieces(self.vocabulary, self.source[i][self.sentences_key])
        return [ids for ids, _ in pieces], [starts for _, starts in pieces]

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, i):
        return self._get(int(i))


class _View(collections.abc.Sequence):
    def __init__(self, documents: LazyDocuments, part: int):
        self.documents, self.part = documents, part

    def __len__(self) -> int:
        return len(self.documents)

    def __getitem__(self, i):
        return self.documents[i][self.part]


class BertPretraining:
    """Documents of sentences -> BERT MLM+NSP examples (whole-word masking by default).

    Records are ``{"verses": [str]}`` (a book); the random B segments come from the other
    documents of ``source_fn()``, tokenised once per process, or with ``lazy=True`` on first
    use (records then carry their position as ``"index"``: large corpora, `LazyDocuments`),
    or with ``streamed=True`` from the record's ``other_sentences`` (a document the stream's
    shuffle buffer holds: `t2t.data.streaming`), tokenised with it.
    """

    def __init__(self, source_fn: Callable[[], RandomAccessSource], sentences_key: str = "verses",
                 mask_rate: float = 0.15, whole_word: bool = True, span: bool = False,
                 short_seq_prob: float = 0.1, lazy: bool = False, streamed: bool = False):
        self.source_fn, self.sentences_key = source_fn, sentences_key
        self.mask_rate, self.whole_word, self.span = mask_rate, whole_word, span
        self.short_seq_prob, self.lazy, self.streamed = short_seq_prob, lazy, streamed
        self._cache: tuple[int, Any, Any, dict] | None = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {**self.__dict__, "_cache": None, "_lock": None}

    def __setstate__(self, state):
        self.__dict__.update(state, _lock=threading.Lock())

    def _documents(self, vocabulary: Any) -> tuple[list, list, dict]:
        with self._lock:  # reader threads share one tokenised corpus
            return self._build_documents(vocabulary)

    def _build_documents(self, vocabulary: Any) -> tuple[list, list, dict]:
        if self.lazy and (self._cache is None or self._cache[0] != id(vocabulary)):
            documents = LazyDocuments(self.source_fn(), vocabulary, self.sentences_key)
            self._cache = (id(vocabulary), documents.tokens, documents.starts, {})
        if self._cache is None or self._cache[0] != id(vocabulary):
            source = self.source_fn()
            records = [source[i] for i in range(len(source))]
            pieces = documents_word_pieces(records, vocabulary, self.sentences_key)
            documents = [[ids for ids, _ in doc] for doc in pieces]
            starts = [[flags for _, flags in doc] for doc in pieces]
            index = {record.get("id", i): i for i, record in enumerate(records)}
            self._cache = (id(vocabulary), documents, starts, index)
        return self._cache[1], self._cache[2], self._cache[3]

    def __call__(self, record: dict, *, seed, vocabulary: Any, sequence_length: dict[str, int]
                 ) -> list[dict]:
        rng = prep.make_rng(seed)
        if self.streamed:          # this document and the one the stream gave beside it
            other = {self.sentences_key: record.get("other_sentences") or []}
            pieces = documents_word_pieces([record, other], vocabulary, self.sentences_key)
            documents = [[ids for ids, _ in doc] for doc in pieces]
            starts = [[flags for _, flags in doc] for doc in pieces]
            position = 0
        else:
            documents, starts, index = self._documents(vocabulary)
            position = record["index"] if self.lazy else index[record.get("id")]
        instances = prep.create_instances_from_document(
            documents, position, rng, sequence_length["inputs"], vocabulary.cls_id,
            vocabulary.sep_id, self.short_seq_prob, word_starts=starts)
        special = (vocabulary.cls_id, vocabulary.sep_id, vocabulary.pad_id, vocabulary.mask_id)
        out = []
        for instance in instances:
            masked = prep.mlm_mask(instance["tokens"], rng, vocabulary.vocab_size,
                                   vocabulary.mask_id, special, self.mask_rate,
                                   sequence_length["max_predictions"], self.whole_word,
                                   instance["word_starts"], self.span)
            out.append({**masked, "token_type_ids": instance["token_type_ids"],
                        "next_sentence_label": instance["next_sentence_label"]})
        return out


def next_token_targets(tokens: Any) -> dict:
    """A left-to-right LM example in BERT's MLM features: every position but the last
    predicts the token after it; the inputs stay unmasked.

    tokens [n] -> ``inputs`` [n], ``token_type_ids`` [n] (zeros), ``masked_positions``
    [n-1] = 0..n-2, ``masked_ids`` [n-1] = tokens[1:], ``masked_weights`` [n-1] (ones).
    """
    tokens = np.asarray(tokens, np.int32)
    n = len(tokens)
    return {"inputs": tokens, "token_type_ids": np.zeros(n, np.int32),
            "masked_positions": np.arange(n - 1, dtype=np.int32),
            "masked_ids": tokens[1:], "masked_weights": np.ones(n - 1, np.float32)}


def bert_ltr(record: dict, *, vocabulary: Any, sequence_length: dict[str, int],
             sentences_key: str = "verses") -> list[dict]:
    """BERT Table 5's left-to-right LM: a document's sentences, tokenised and concatenated
    in order, cut into ``[CLS] tokens [SEP]`` rows of ``sequence_length["inputs"]`` (the
    last shorter), each as `next_token_targets`. No NSP, no [MASK]. Rows may start and end
    mid-sentence, as an LM's do: sentence-aligned rows filled only 86% of 128 tokens."""
    ids = [t for sentence in record[sentences_key]
           for t in vocabulary.encode(prep.decode_text(sentence), add_special_tokens=False)]
    room = sequence_length["inputs"] - 2
    return [next_token_targets([vocabulary.cls_id, *chunk, vocabulary.sep_id])
            for chunk in prep.split_tokens(ids, room)]


# ----------------------------------------------------------------------------- vocabularies


# T5 objective-table variants (gin names) registered as <corpus>_<name>.
OBJECTIVE_VARIANTS = ("iid_15_u_u", "iid_15_b_f", "iid_15_m_f", "iid_15_d_d", "all_permute",
                      "iid_10_u_u", "iid_25_u_u", "iid_50_u_u",
                      "span_2_15_u_u", "span_5_15_u_u", "span_10_15_u_u")


def t5_objective_tasks(corpus: str, source_fn: Callable[[], RandomAccessSource],
                       to_tokens: Sequence[Callable], vocabulary: Any, over: str) -> list[Task]:
    """``<corpus>_span_corruption``, ``_lm``, ``_prefix_lm``, ``_<variant>`` for each of
    `OBJECTIVE_VARIANTS` and ``_<name>`` for each BART objective of
    `t2t.data.bart_noising.OBJECTIVES` (unregistered); ``to_tokens`` turns a record into
    ``{"tokens"}`` and ``over`` names the text in the descriptions."""
    first = list(to_tokens)
    tasks = [
        Task(f"{corpus}_span_corruption", source_fn,
             first + [split_for_span_corruption, span_corruption], vocabulary,
             description=f"T5 span corruption (span_3_15_u_u) over {over}"),
        Task(f"{corpus}_lm", source_fn, first + [lm_chunks], vocabulary,
             description=f"causal LM over {over}"),
        Task(f"{corpus}_prefix_lm", source_fn, first + [prefix_lm_chunks], vocabulary,
             description=f"T5 prefix LM over {over}"),
    ]
    for name in OBJECTIVE_VARIANTS:
        split_fn: Callable = split_to_length
        if name.startswith("span_"):
            split_fn = functools.partial(split_for_span_corruption,
                                         mean_noise_span_length=float(name.split("_")[1]))
        tasks.append(Task(f"{corpus}_{name}", source_fn,
                          first + [split_fn, functools.partial(denoise_objective, objective=name)],
                          vocabulary, description=f"T5 objective {name} over {over}"))
    for name in bart_noising.OBJECTIVES:   # BART's Table 1 noising, targets the whole chunk
        tasks.append(Task(f"{corpus}_{name}", source_fn,
                          first + [split_to_length,
                                   functools.partial(bart_objective, objective=name)],
                          vocabulary, description=f"BART objective {name} over {over}"))
    return tasks




def from_files(train_files: Any, validation_files: Any = None, test_files: Any = None,
               **kwargs: Any) -> Any:
    """A fine-tuning task over your own labelled files (globs, paths or directories of
    JSONL, TSV/CSV with a header row, SQuAD JSON or CoNLL), each split read and checked
    now: `t2t.data.user_tasks.from_files`, the function behind
    configs/experiments/finetune_*_from_files.gin. Keywords: ``input_field`` and
    ``target_field`` (text-to-text), or ``text_field`` (+ ``text_pair_field``) and
    ``label_field`` (classification; regression when the labels are numbers, some not
    whole), ``task_prefix``, ``metrics`` (names; default by kind), ``vocabulary``,
    ``labels``, ``name``. Register it with `register_task` to use it by name::

        task = from_files("data/train.jsonl", "data/dev.jsonl", "data/test.jsonl",
                          input_field="en", target_field="fr", task_prefix="translate: ")
        task.bad_lines["train"].counts   # Counter({'undecodable': 1, 'missing_field': 2})
    """
    from t2t.data import user_tasks
    return user_tasks.from_files(train_files, validation_files, test_files, **kwargs)

