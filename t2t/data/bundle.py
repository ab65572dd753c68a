"""Data that travels: the `micro` scale's pretraining corpus and downstream tasks in one small
directory, so a machine that cannot run `t2t data build` (a lent accelerator host reaches no
package registry) trains on what `micro` trains on (issue 61).

    t2t data bundle micro --out runs/bundles/micro [--tokens N]   # after `t2t data build
    t2t data bundle --verify runs/bundles/micro                   #   micro_corpus bbc spam`

writes, from what `t2t data build micro_corpus bbc spam` made:

* ``corpus.tokens.xz``: the training split of ``micro_corpus`` as the SentencePiece ids
  `tasks.tokenize` gives each document with ``micro_sentencepiece``, uint16 little-endian,
  the documents one after another, xz-compressed (0.82 bytes a token on the micro corpus,
  against zlib's 1.10), and ``corpus.npz`` (`np.savez_compressed`): ``offsets`` (int64:
  document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``) and ``sources`` (uint8: each
  document's source, an index into the manifest's ``corpus.sources``). With ``--tokens N``,
  only the documents first in a fixed hash order of their ids until N tokens are kept, in
  corpus order;
* ``tasks/<task>.<split>.jsonl.gz``: the records of ``bbc_topic_200`` and ``spam_100``
  (`t2t.data.catalog.low_resource`), train and validation, as the built datasets hold them,
  so each task's own formatting and tokenization run on them unchanged;
* the SentencePiece model under its own file name (``spm_16000_<digest>.model``), so a
  stage's ``vocabulary`` in stage.json names the same file as `micro`'s stages;
* ``manifest.json``: the format, what was kept, each file's bytes and sha256, and the
  datasets it came from (their manifests' ``source`` and ``license``).

The `gpu_micro` scale (configs/ablations/scales/t5_gpu_micro.gin) reads it through two gin
builders (registered in `t2t.run.configurables`): ``CORPUS = @bundle_corpus()`` registers
``micro_bundle_<objective>`` for every T5 objective (`tasks.t5_objective_tasks`) over the
bundle's documents, ``experiment.task = @bundle_task()`` registers
``micro_bundle_bbc_topic_200`` and ``micro_bundle_spam_100``. Opening a bundle checks every
file against the manifest's sha256 (a copy cut short is one line, not a wrong table).
"""
from __future__ import annotations

import argparse
import functools
import gzip
import hashlib
import json
import lzma
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from t2t.data import preprocessors as prep
from t2t.data.sources import JsonlSource
from t2t.data.tasks import Task, register_task, t5_objective_tasks
from t2t.data.vocab import SentencePieceVocabulary
from t2t.errors import EXIT_USAGE, ConfigError, UserError
from t2t.storage import sha256_file

NAME = "micro_bundle"          # the corpus name: tasks micro_bundle_<objective>, ..._spam_100
FORMAT = 1
MANIFEST = "manifest.json"
TOKENS_FILE = "corpus.tokens.xz"
INDEX_FILE = "corpus.npz"
XZ_PRESET = 6
TASK_SPLITS = ("train", "validation")
SALT = "t2t-bundle"            # the hash order a --tokens subset is taken in
ENCODE_BATCH = 2048            # documents per SentencePiece call


class BundleError(UserError):
    """A bundle that cannot be written or read as asked; the message says what to do."""


def task_specs() -> dict[str, Any]:
    """The downstream tasks a bundle holds: {name without prefix: `LowResourceSplits`}."""
    from t2t.data.catalog import low_resource
    return {"bbc_topic_200": low_resource.BBC_200, "spam_100": low_resource.SPAM_100}


# ----------------------------------------------------------------------------- writing


def _ids(texts: Sequence[str], vocabulary: Any) -> list[list[int]]:
    encode_batch = getattr(vocabulary, "encode_batch", None)
    return encode_batch(texts) if encode_batch else [vocabulary.encode(t) for t in texts]


def tokenized_documents(source: Any, vocabulary: Any) -> Iterator[tuple[dict, np.ndarray]]:
    """(record, uint16 ids) of each record of `source` that `tasks.tokenize` keeps (a
    record whose text is empty is dropped there too), in source order."""
    batch: list[tuple[dict, str]] = []
    for i in range(len(source) + 1):
        if i < len(source):
            record = source[i]
            try:
                if not isinstance(record, dict):       # a line the source could not read
                    raise prep.SkipExample("undecodable")
                batch.append((record, prep.decode_text(record["text"])))
            except prep.SkipExample:
                continue
        if batch and (len(batch) == ENCODE_BATCH or i == len(source)):
            for (record, _), ids in zip(batch, _ids([t for _, t in batch], vocabulary)):
                if ids:
                    yield record, np.asarray(ids, np.uint16)
            batch = []


def hash_rank(doc_id: str) -> bytes:
    return hashlib.sha256(f"{SALT}\x00{doc_id}".encode()).digest()


def keep_up_to(ids: Sequence[str], lengths: Sequence[int], tokens: int | None) -> np.ndarray:
    """Positions of the documents kept for a budget of `tokens` (None: all): those first in
    the hash order of their ids until the budget is reached, in their own order."""
    if tokens is None:
        return np.arange(len(ids))
    order = sorted(range(len(ids)), key=lambda i: hash_rank(ids[i]))
    total, kept = 0, []
    for i in order:
        if total >= tokens:
            break
        kept.append(i)
        total += lengths[i]
    return np.asarray(sorted(kept), dtype=np.int64)


def write_corpus(out: Path, source: Any, vocabulary: Any, tokens: int | None,
                 progress: bool = False) -> dict:
    """The corpus files of `source`'s documents (all, or `tokens`' worth); what they hold."""
    from t2t.data.catalog.builders import progress_bar
    records, arrays = [], []
    for record, ids in progress_bar(tokenized_documents(source, vocabulary), progress,
                                    "tokenizing", total=len(source)):
        records.append((record["id"], record.get("source", "")))
        arrays.append(ids)
    lengths = [len(a) for a in arrays]
    kept = keep_up_to([r[0] for r in records], lengths, tokens)
    names = sorted({r[1] for r in records})
    if len(names) > 256:
        raise BundleError(f"the corpus has {len(names)} sources; a bundle keeps at most 256")
    offsets = np.zeros(len(kept) + 1, np.int64)
    offsets[1:] = np.cumsum([lengths[i] for i in kept])
    stored = np.concatenate([arrays[i] for i in kept]) if len(kept) else np.zeros(0, np.uint16)
    sources = np.asarray([names.index(records[i][1]) for i in kept], np.uint8)
    with lzma.open(out / TOKENS_FILE, "wb", preset=XZ_PRESET) as f:
        for start in range(0, len(stored), 1 << 22):
            f.write(stored[start:start + (1 << 22)].astype("<u2").tobytes())
    np.savez_compressed(out / INDEX_FILE, offsets=offsets, sources=sources)
    per_source: dict[str, dict] = {n: {"documents": 0, "tokens": 0, "documents_kept": 0,
                                       "tokens_kept": 0} for n in names}
    kept_set = set(kept.tolist())
    for i, ((_, name), n) in enumerate(zip(records, lengths)):
        per_source[name]["documents"] += 1
        per_source[name]["tokens"] += n
        if i in kept_set:
            per_source[name]["documents_kept"] += 1
            per_source[name]["tokens_kept"] += n
    return {"tokens_file": TOKENS_FILE, "index_file": INDEX_FILE, "dtype": "<u2",
            "documents": int(len(kept)),
            "tokens": int(offsets[-1]), "documents_total": len(records),
            "tokens_total": int(sum(lengths)), "token_budget": tokens,
            "subset": None if tokens is None else
            f"documents first in the sha256 order of '{SALT}\\0<id>' until {tokens:,} tokens, "
            "kept in corpus order",
            "sources": names, "per_source": per_source}


def _write_jsonl_gz(records: Sequence[dict], path: Path) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        for record in records:
            f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))


def write_tasks(out: Path) -> dict:
    """``tasks/<task>.<split>.jsonl.gz`` for each of `task_specs()`; what each holds."""
    (out / "tasks").mkdir()
    held = {}
    for name, spec in task_specs().items():
        held[name] = {"dataset": spec.dataset, "n_train": spec.n_train,
                      "n_validation": spec.n_validation, "splits": {}}
        for split in TASK_SPLITS:
            records = spec.records(split)
            rel = f"tasks/{name}.{split}.jsonl.gz"
            _write_jsonl_gz(records, out / rel)
            held[name]["splits"][split] = {"file": rel, "records": len(records)}
    return held


def file_table(root: Path) -> dict[str, dict]:
    """{relative path: {bytes, sha256}} of every file under `root` but the manifest."""
    return {p.relative_to(root).as_posix(): {"bytes": p.stat().st_size,
                                             "sha256": sha256_file(p)}
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}


def _origins(datasets: Sequence[str]) -> dict[str, dict]:
    from t2t.data.catalog import builders
    found = {}
    for name in datasets:
        manifest = builders.manifest(name)
        found[name] = {k: manifest[k] for k in ("source", "license", "counts") if k in manifest}
    return found


def write(out: str | os.PathLike, vocabulary: Any = None, tokens: int | None = None,
          progress: bool = False) -> dict:
    """Write the bundle of the built ``micro_corpus``, ``bbc`` and ``spam`` into `out`
    (replaced if it exists; written beside it and renamed, so it is whole or absent), the
    corpus tokenized with `vocabulary` (default ``micro_sentencepiece``); its manifest."""
    from t2t.data.catalog import builders, micro
    out = Path(out)
    if tokens is not None and tokens <= 0:
        raise BundleError(f"--tokens {tokens}: give a positive number of tokens, or none")
    source = micro.micro_source("train")        # BuildError naming `t2t data build` if absent
    vocabulary = vocabulary or micro.micro_sentencepiece()
    if vocabulary.vocab_size > np.iinfo(np.uint16).max + 1:
        raise BundleError(f"a vocabulary of {vocabulary.vocab_size:,} ids does not fit the "
                          "bundle's uint16 token ids")
    datasets = [micro.NAME] + sorted({spec.dataset for spec in task_specs().values()})
    for name in datasets:
        builders.manifest(name)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        corpus = write_corpus(tmp, source, vocabulary, tokens, progress)
        held = write_tasks(tmp)
        model_file = getattr(vocabulary, "model_file", None)
        vocab_file = Path(model_file).name if model_file else "sentencepiece.model"
        (tmp / vocab_file).write_bytes(vocabulary.model_proto)
        files = file_table(tmp)
        manifest = {"format": FORMAT, "name": "micro", "corpus": corpus, "tasks": held,
                    "vocabulary": {"file": vocab_file, "vocab_size": int(vocabulary.vocab_size),
                                   "extra_ids": int(getattr(vocabulary, "extra_ids", 0))},
                    "datasets": _origins(datasets), "files": files,
                    "bytes": sum(f["bytes"] for f in files.values())}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


# ----------------------------------------------------------------------------- reading


class Bundle:
    """A bundle directory, checked against its manifest; its corpus is loaded on first use."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        manifest_path = self.path / MANIFEST
        if not manifest_path.is_file():
            raise BundleError(f"no bundle at {self.path} (no {MANIFEST}): make one with "
                              f"`t2t data bundle micro --out {self.path}` where `t2t data "
                              "build micro_corpus bbc spam` has run, and bring it along")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("format") != FORMAT:
            raise BundleError(f"{manifest_path} is format {self.manifest.get('format')!r}; "
                              f"this t2t reads format {FORMAT}: write the bundle again")
        for rel, want in self.manifest["files"].items():
            path = self.path / rel
            if not path.is_file() or sha256_file(path) != want["sha256"]:
                what = "missing" if not path.is_file() else "not the file the manifest names"
                raise BundleError(f"bundle {self.path}: {rel} is {what} (sha256 differs); "
                                  "copy the bundle again")
        self._arrays: dict[str, np.ndarray] | None = None
        self._vocabulary: SentencePieceVocabulary | None = None

    def __getstate__(self) -> dict:
        """Pickled for a pipeline's worker processes without the corpus (each reads it)."""
        return {"path": self.path, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        self.path, self.manifest = state["path"], state["manifest"]
        self._arrays, self._vocabulary = None, None

    @property
    def tasks(self) -> dict[str, dict]:
        return self.manifest["tasks"]

    @property
    def vocabulary(self) -> SentencePieceVocabulary:
        if self._vocabulary is None:
            vocab = self.manifest["vocabulary"]
            self._vocabulary = SentencePieceVocabulary(str(self.path / vocab["file"]),
                                                       extra_ids=vocab["extra_ids"])
        return self._vocabulary

    def arrays(self) -> dict[str, np.ndarray]:
        """``tokens``, ``offsets`` and ``sources`` of the corpus (decompressed once)."""
        if self._arrays is None:
            corpus = self.manifest["corpus"]
            with lzma.open(self.path / corpus["tokens_file"]) as f:
                tokens = np.frombuffer(f.read(), dtype=corpus["dtype"])
            with np.load(self.path / corpus["index_file"]) as npz:
                self._arrays = {"tokens": tokens, "offsets": npz["offsets"],
                                "sources": npz["sources"]}
        return self._arrays

    def task_source(self, task: str | None, split: str) -> JsonlSource:
        """The records of one of the bundle's downstream tasks' splits."""
        held = self.tasks.get(task or "", {}).get("splits", {})
        if split not in held:
            raise ConfigError(f"bundle {self.path} holds {sorted(self.tasks)} with splits "
                              f"{list(TASK_SPLITS)}; not {task!r} / {split!r}")
        return JsonlSource(self.path / held[split]["file"])


class BundleDocuments:
    """The bundle's corpus as records ``{"tokens": int32 ids}``: what `tasks.tokenize` makes
    of the same documents, so the T5 objectives' preprocessors follow unchanged."""

    def __init__(self, bundle: Bundle):
        self.bundle = bundle

    def __len__(self) -> int:
        return len(self.bundle.arrays()["offsets"]) - 1

    def __getitem__(self, index: int) -> dict:
        arrays = self.bundle.arrays()
        start, stop = arrays["offsets"][index], arrays["offsets"][index + 1]
        return {"tokens": arrays["tokens"][start:stop].astype(np.int32)}


class ParallelTask(Task):
    """`task` whose pipeline preprocesses and packs in `workers` processes
    (`pipeline.make_pipeline`'s ``worker_count``; 0: in this process). The batches depend on
    the count (0 and 1 give the same ones), so the count is part of the recipe."""

    def __init__(self, task: Task, workers: int):
        super().__init__(task.name, task.source_fn, task.preprocessors, task.vocabulary,
                         task.metric_fns, task.description)
        self.workers = workers

    def get_pipeline(self, converter: Any, batch_size: int, seed: int, **kwargs: Any) -> Any:
        kwargs.setdefault("worker_count", self.workers)
        return super().get_pipeline(converter, batch_size, seed, **kwargs)


def token_ids(record: dict) -> dict:
    """The bundle's `tasks.tokenize`: its records are ids already. It takes tokenize's place
    so that each later step gets the seed it gets in micro's own tasks (a step's seed holds
    its position), and a document's examples are micro's."""
    return {"tokens": record["tokens"]}


@functools.lru_cache(maxsize=4)
def _opened(path: str, stats: tuple) -> Bundle:
    return Bundle(path)


def _stats(root: Path) -> tuple:
    """(file, size, mtime) of the manifest and each file it lists: what a cached open of the
    bundle must still match."""
    manifest = root / MANIFEST
    listed = sorted(json.loads(manifest.read_text()).get("files", {})) if manifest.is_file() \
        else []
    found = []
    for rel in [MANIFEST, *listed]:
        path = root / rel
        stat = path.stat() if path.is_file() else None
        found.append((rel, stat.st_size if stat else -1, stat.st_mtime_ns if stat else -1))
    return tuple(found)


def open_bundle(path: str | os.PathLike) -> Bundle:
    """The bundle at `path`, checked against its manifest once per process while none of
    its files changes; a BundleError naming the command that makes one if there is none."""
    resolved = Path(path).expanduser().resolve()
    return _opened(str(resolved), _stats(resolved))


def bundle_corpus(path: str, workers: int = 0) -> str:
    """`experiment.corpus` over a bundle: registers ``micro_bundle_<objective>`` for every T5
    objective over its documents, their examples made in `workers` processes (an
    accelerator's step outruns one core making them); returns the corpus name."""
    if workers < 0:
        raise ConfigError(f"bundle_corpus.workers = {workers}: give 0 (this process) or more")
    bundle = open_bundle(path)
    documents = functools.partial(BundleDocuments, bundle)
    for task in t5_objective_tasks(NAME, documents, [token_ids], bundle.vocabulary,
                                   f"the micro corpus bundle {path}"):
        register_task(ParallelTask(task, workers), overwrite=True)
    return NAME


def bundle_task(path: str, name: str) -> str:
    """`experiment.task` for a fine-tuning on one of a bundle's downstream tasks
    (``micro_bundle_bbc_topic_200``, ``micro_bundle_spam_100``): registers them; returns
    `name`."""
    from t2t.data.catalog import low_resource
    bundle = open_bundle(path)
    specs = task_specs()
    prefix = f"{NAME}_"

    def sources(spec: Any):
        held = next((key for key, known in specs.items() if known == spec), None)
        return functools.partial(bundle.task_source, held)

    tasks = [t for t in low_resource.low_resource_tasks(bundle.vocabulary, prefix, sources)
             if t.name[len(prefix):] in bundle.tasks]
    for task in tasks:
        register_task(task, overwrite=True)
    if name not in {t.name for t in tasks}:
        raise ConfigError(f"bundle {path} holds the tasks {sorted(t.name for t in tasks)}, "
                          f"not {name!r}")
    return name


# ----------------------------------------------------------------------------- command


def summary(manifest: dict, path: str | os.PathLike) -> str:
    corpus = manifest["corpus"]
    tasks = ", ".join(f"{name} {'/'.join(str(s['records']) for s in held['splits'].values())}"
                      for name, held in manifest["tasks"].items())
    return (f"{path}: {manifest['bytes'] / 2**20:.1f} MiB; corpus {corpus['tokens']:,} of "
            f"{corpus['tokens_total']:,} tokens ({corpus['documents']:,} of "
            f"{corpus['documents_total']:,} documents); tasks (train/validation) {tasks}; "
            f"vocabulary {manifest['vocabulary']['file']}")


def main(argv: Sequence[str] | None = None) -> int:
    """`t2t data bundle micro --out DIR [--tokens N]` or `t2t data bundle --verify DIR`."""
    parser = argparse.ArgumentParser(
        prog="t2t data bundle", description="the micro scale's corpus (token ids) and "
        "downstream tasks in one small directory that travels (t2t/data/bundle.py)")
    parser.add_argument("name", nargs="?", choices=["micro"],
                        help="what to bundle: the micro scale's data (built by `t2t data "
                             "build micro_corpus bbc spam`)")
    parser.add_argument("--out", help="the bundle's directory (replaced if it exists)")
    parser.add_argument("--tokens", type=int,
                        help="keep only this many training tokens of the corpus (whole "
                             "documents in a fixed hash order; default: all)")
    parser.add_argument("--verify", metavar="DIR",
                        help="check a bundle's files against its manifest, print what it "
                             "holds, and exit")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.verify and not (args.name and args.out):
        parser.error("give NAME and --out DIR to write a bundle, or --verify DIR")
    try:
        if args.verify:
            print("verified", summary(open_bundle(args.verify).manifest, args.verify))
            return 0
        manifest = write(args.out, tokens=args.tokens, progress=not args.no_progress)
    except UserError as e:                # one line, as every t2t command (exit 2)
        print(f"error: {e.summary}", file=sys.stderr)
        return EXIT_USAGE
    print("wrote", summary(manifest, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
