"""What your data amounts to, said before a run starts and again when it ends.

`scan` reads a split of a task over your files once, as training and evaluation will
(the same preprocessors and feature converter): examples, tokens per feature, examples
cut to the feature lengths (``truncated``), and the bad lines the readers skipped
(`t2t.data.user_files`). Text read as a stream (`t2t.data.streaming`) is scanned on its
first documents (``stream_limit``, ``stream_chars``) and the counts extrapolated by the
share of the files' bytes read; its bad lines are counted again as training meets them,
and `after_training` adds those counts (``read``) to the reports, data.json, the end-of-run
lines and a row of metrics.jsonl. `announce` adds the budget (packing, epochs that TRAIN_STEPS x
BATCH_SIZE amounts to) and the vocabulary's byte-fallback rate on your text, logs it all,
warns when more than 1% of a split's lines are bad or cut, and keeps the reports on the
task (``task.data_reports``) for the end of the run and metrics.json. Splits larger than
``limit`` records are scanned on an evenly spread sample and the counts extrapolated (≈).
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from t2t.data.finetune_tasks import spread
from t2t.data.preprocessors import SkipExample
from t2t.data.streaming import stream_of
from t2t.data.user_files import BadLines
from t2t.data.vocab_training import coverage

_log = logging.getLogger(__name__)
BAD_SHARE = 0.01          # warn above this share of bad (or cut) lines
COUNTED = ("undecodable", "missing_field", "empty")


@dataclasses.dataclass
class SplitReport:
    """One split of your data as the run sees it."""

    split: str
    files: list[str]
    lines: int                            # lines (records, documents) read
    examples: int                         # model examples made from the good ones
    bad: BadLines
    truncated: int = 0                    # examples cut to the feature lengths
    tokens: dict = dataclasses.field(default_factory=dict)   # feature -> tokens
    sampled: float = 1.0                  # share of the records scanned
    unit: str = "lines"                   # what `lines` counts: "lines" | "documents"
    texts: list = dataclasses.field(default_factory=list, repr=False)  # for coverage
    read: dict | None = None              # a stream: what training read (`after_training`)

    @property
    def bad_share(self) -> float:
        return self.bad.total / max(self.lines, 1)

    def as_dict(self) -> dict[str, Any]:
        """The counts of metrics.json's "data" entry."""
        out = {"files": self.files[:100], "file_count": len(self.files),
               self.unit: self.lines, "examples": self.examples,
               **{r: int(self.bad.counts.get(r, 0)) for r in COUNTED},
               "truncated": self.truncated, "tokens": dict(self.tokens)}
        if self.bad.total:
            out["first_bad_line"] = self.bad.first_any()
        if self.sampled < 1:
            out["sampled"] = round(self.sampled, 4)
        if self.read is not None:
            out["read_in_training"] = self.read
        return out


def _source(task: Any, split: str) -> Any:
    return task.get_source(split) if hasattr(task, "get_source") else task.source


STREAM_LIMIT = 1_000          # documents of a stream's head scanned before a run
STREAM_CHARS = 2_000_000      # ... and at most this many characters of them


def scan(task: Any, split: str, converter: Any = None, *, encoder_vocabulary: Any = None,
         max_length: int | None = None, limit: int = 20_000, max_texts: int = 2_000,
         stream_limit: int = STREAM_LIMIT, stream_chars: int = STREAM_CHARS) -> SplitReport:
    """One split's `SplitReport`: through ``converter`` (text-to-text and pretraining
    tasks) or, for BERT-style classifiers, ``encoder_vocabulary`` and ``max_length``."""
    source = _source(task, split)
    bad = BadLines()
    bad.merge(task.bad_lines.get(split, BadLines()))
    report = SplitReport(split, list(task.files.get(split, [])), task.raw_lines.get(split, 0),
                         0, bad)
    if getattr(task, "kind", "") == "pretraining":
        report.unit = "documents"
    stream = stream_of(source)
    if stream is not None:
        head = stream.head(stream_limit, stream_chars)
        records = ((i, record) for i, (record, _) in enumerate(head))
        _scan_examples(report, task, records, _stream_where, converter, max_texts)
        report.bad.merge(head.bad)
        report.sampled = max(head.fraction, 1e-9)
        report.lines = (head.documents if head.fraction >= 1
                        else round(head.documents / report.sampled))
        indices: Sequence[int] = ()
    else:
        indices = spread(len(source), limit)
        report.sampled = len(indices) / max(len(source), 1)
    if stream is not None:
        pass                                   # scanned above
    elif encoder_vocabulary is not None and getattr(task, "encoder_pair_fn", None):
        _scan_pairs(report, task, source, indices, encoder_vocabulary, max_length, max_texts)
    elif converter is not None and task.kind not in ("span_qa", "tagging"):
        _scan_examples(report, task, ((i, source[i]) for i in indices),
                       functools.partial(_where, source), converter, max_texts)
    else:
        report.examples = len(indices)
    if report.sampled < 1:
        scale = 1 / report.sampled
        report.examples = round(report.examples * scale)
        report.truncated = round(report.truncated * scale)
        report.tokens = {k: round(v * scale) for k, v in report.tokens.items()}
    return report


def _where(source: Any, i: int, record: Any = None) -> str:
    return source.where(i) if hasattr(source, "where") else f"record {i}"


def _stream_where(i: int, record: Mapping) -> str:
    return str(record["id"])


def _scan_examples(report: SplitReport, task: Any, records: Iterable[tuple[int, Any]],
                   where: Callable[[int, Any], str], converter: Any, max_texts: int) -> None:
    for i, record in records:
        try:
            examples = task.preprocess(record, (0, 0, i), converter.lengths)
        except SkipExample as skip:
            report.bad.add(skip.reason if skip.reason in COUNTED else "empty",
                           where(i, record), skip.reason)
            continue
        for example in examples:
            try:
                packable, cut = converter.prepare(example)
            except SkipExample as skip:
                report.bad.add("empty", where(i, record), skip.reason)
                continue
            report.examples += 1
            report.truncated += bool(cut)
            for key, value in packable.items():
                if key in converter.lengths:
                    report.tokens[key] = report.tokens.get(key, 0) + len(value)
        if len(report.texts) < max_texts and isinstance(record, Mapping):
            report.texts += _record_texts(task, record, examples)


def _record_texts(task: Any, record: Mapping, examples: Sequence[Mapping]) -> list[str]:
    if "text" in record and getattr(task, "kind", "") == "pretraining":
        return [str(record["text"])]
    out = []
    for ex in examples[:1]:
        for key in ("inputs_pretokenized", "targets_pretokenized"):
            if key in ex:
                out.append(str(ex[key]))
    if out and getattr(task, "input_prefix", None) and out[0].startswith(task.input_prefix):
        out[0] = out[0][len(task.input_prefix):]
    return out


def _scan_pairs(report: SplitReport, task: Any, source: Any, indices: Sequence[int],
                vocabulary: Any, max_length: int | None, max_texts: int) -> None:
    pairs = [task.encoder_pair_fn(source[i]) for i in indices]
    a = vocabulary.encode_batch([p[0] for p in pairs], add_special_tokens=False)
    b = vocabulary.encode_batch([p[1] or "" for p in pairs], add_special_tokens=False)
    tokens = 0
    for (_, second, _), ta, tb in zip(pairs, a, b):
        n = len(ta) + 2 + (len(tb) + 1 if second is not None else 0)
        report.truncated += bool(max_length and n > max_length)
        tokens += min(n, max_length or n)
    report.examples = len(pairs)
    report.tokens = {"inputs": tokens}
    report.texts = [t for p in pairs[:max_texts] for t in (p[0], p[1]) if t]


# ----------------------------------------------------------------------------- the budget


def examples_per_row(converter: Any, report: SplitReport, task: Any, batch_rows: int,
                     batches: int = 4) -> float:
    """Mean examples per packed row over the first ``batches`` batches of the split in file
    order, packed as the pipeline packs (first fit); 1 when the converter does not pack."""
    if converter is None or not converter.pack:
        return 1.0
    source = _source(task, report.split)
    stream = stream_of(source)
    records = (enumerate(record for record, _ in stream.head(STREAM_LIMIT, STREAM_CHARS))
               if stream is not None else ((i, source[i]) for i in range(len(source))))
    rows = packed = 0
    packer = converter.new_packer(batch_rows)
    for i, record in records:
        try:
            examples = task.preprocess(record, (0, 0, i), converter.lengths)
        except SkipExample:
            continue
        for example in examples:
            try:
                packable, _ = converter.prepare(example)
            except SkipExample:
                continue
            if not packer.add(packable):
                rows, packed = rows + batch_rows, packed + packer.num_examples
                if rows >= batches * batch_rows:
                    return packed / rows
                packer = converter.new_packer(batch_rows)
                packer.add(packable)
    used = len(next(iter(packer.rows().values())))     # the last batch's non-empty rows
    return (packed + packer.num_examples) / max(rows + used, 1)


def _n(value: float, approx: bool = False) -> str:
    return ("≈" if approx else "") + f"{value:,.0f}"


def budget_lines(reports: Mapping[str, SplitReport], steps: int, batch_size: int,
                 per_row: float) -> list[str]:
    """The report's lines: each split, packing, the epochs of the training budget."""
    lines = []
    for r in reports.values():
        approx = r.sampled < 1
        tokens = ", ".join(f"{k} {_n(v, approx)}" for k, v in r.tokens.items())
        bad = (f"; {r.bad.total:,} bad lines skipped ("
               + ", ".join(f"{k} {v}" for k, v in sorted(r.bad.counts.items())) + ")"
               if r.bad.total else "; no bad line")
        cut = f"; {_n(r.truncated, approx)} cut to the feature lengths" if r.truncated else ""
        lines.append(f"  {r.split:<10} {_n(r.examples, approx)} examples from {r.lines:,} "
                     f"{r.unit} of {len(r.files)} file(s)" + (f"; tokens: {tokens}" if tokens
                                                           else "") + bad + cut)
    train = reports.get("train")
    if train and train.examples and steps:
        rows = steps * batch_size
        seen = rows * per_row
        lines.append(f"  packing: {per_row:.2f} examples per row")
        lines.append(f"  budget: {steps:,} steps x batch {batch_size} = {rows:,} rows "
                     f"≈ {seen:,.0f} examples = {seen / train.examples:.2f} epochs of train")
    return lines


def warnings(reports: Mapping[str, SplitReport], lengths: Mapping[str, int] | None
             ) -> list[str]:
    """A line per split with more than 1% of its lines bad or examples cut."""
    out = []
    for r in reports.values():
        if r.bad_share > BAD_SHARE:
            out.append(f"warning: {r.bad.total:,} of the {r.lines:,} {r.unit} of {r.split} "
                       f"({100 * r.bad_share:.1f}%) are bad and skipped; the first: "
                       f"{r.bad.first_any()}")
        if r.examples and r.truncated / r.examples > BAD_SHARE:
            out.append(f"warning: {r.truncated:,} {r.split} examples "
                       f"({100 * r.truncated / r.examples:.1f}%) are longer than the feature "
                       f"lengths {dict(lengths or {})} and are cut: raise them "
                       "(--gin.TASK_FEATURE_LENGTHS=... or MAX_LENGTH) to keep their ends")
    return out


def coverage_lines(vocabulary: Any, texts: Sequence[str], remedy: str) -> list[str]:
    """The vocabulary's byte-fallback (or [UNK]) rate on ``texts``, warning when high."""
    if vocabulary is None or not texts:
        return []
    cov = coverage(vocabulary, texts)
    line = (f"  vocabulary: {100 * cov.rate:.2f}% of the tokens of your train text are "
            f"{cov.kind}")
    if not cov.high:
        return [line]
    chars = " ".join(cov.missing)
    return [line, f"warning: {100 * cov.rate:.1f}% of your text's tokens are {cov.kind} "
                  f"(characters the vocabulary lacks: {chars}); each costs the model steps "
                  f"and length. {remedy}"]


def remedy(task: Any) -> str:
    if getattr(task, "kind", "") == "pretraining":
        return ("Leave VOCABULARY unset to train one on your files.")
    return ("The vocabulary comes with the pretrained model: pretrain on text like yours "
            "(t2t train --gin_file=experiments/t5_tiny_bible.gin --gin.TEXT_FILES=...) and "
            "fine-tune from that MODEL_DIR, whose vocabulary is trained on it.")


def announce(task: Any, converter: Any, batch_size: int, steps: int, *,
             encoder_vocabulary: Any = None, max_length: int | None = None,
             model_dir: str | None = None) -> dict[str, SplitReport]:
    """Scans every split of a task over your files, logs what the run's budget means,
    keeps the reports on ``task.data_reports`` and writes them to MODEL_DIR/data.json."""
    splits = getattr(task, "splits", ("train",))
    reports = {s: scan(task, s, converter, encoder_vocabulary=encoder_vocabulary,
                       max_length=max_length) for s in splits}
    per_row = examples_per_row(converter, reports[splits[0]], task,
                               max(batch_size // _process_count(), 1))
    lengths = converter.lengths if converter is not None else {"inputs": max_length}
    vocabulary = encoder_vocabulary or getattr(task, "vocabulary", None)
    lines = (["your data (examples after skipping bad lines; tokens as the model sees "
              f"them, at most {dict(lengths)} each):"]
             + budget_lines(reports, steps, batch_size, per_row)
             + coverage_lines(vocabulary, reports[splits[0]].texts, remedy(task)))
    for line in lines + warnings(reports, lengths):
        (_log.warning if line.startswith("warning") else _log.info)(line)
    task.data_reports = reports
    if model_dir:
        write(model_dir, reports)
    return reports


def _process_count() -> int:
    import jax
    return jax.process_count()


def as_dict(reports: Mapping[str, SplitReport]) -> dict[str, dict]:
    return {split: r.as_dict() for split, r in reports.items()}


def write(model_dir: str, reports: Mapping[str, SplitReport]) -> None:
    """MODEL_DIR/data.json: the reports' counts (process 0)."""
    import json

    import jax

    from t2t import storage
    if jax.process_index() == 0:
        path = storage.path(model_dir)
        path.mkdir(parents=True, exist_ok=True)
        (path / "data.json").write_text(json.dumps(as_dict(reports), indent=2) + "\n")


def after_training(reports: Mapping[str, SplitReport], train_data: Any,
                   model_dir: str | None) -> dict | None:
    """A stream's counts as training met them (documents read, bad lines by reason, the
    first of each: ``train_data.bad_lines()``) into the train report's ``read`` and
    data.json; returns them as metrics.jsonl's ``data/...`` row (None for other sources)."""
    bad = getattr(train_data, "bad_lines", None)
    report = reports.get("train")
    if bad is None or report is None or report.unit != "documents":
        return None
    lines, stats = bad(), train_data.stats
    report.read = {"documents": stats["documents"], "examples": stats["examples"],
                   **{r: int(lines["counts"].get(r, 0)) for r in COUNTED}}
    if lines["earliest"]:
        report.read["first_bad_line"] = lines["earliest"]
    if model_dir:
        write(model_dir, reports)
    return {f"data/{k}": v for k, v in report.read.items()}


def end_lines(reports: Mapping[str, SplitReport]) -> list[str]:
    """What the end of a run says about the data: bad lines and cut examples per split."""
    out = []
    for r in reports.values():
        if r.read is not None:                 # a stream: what training read
            counts = ", ".join(f"{k} {r.read[k]}" for k in COUNTED)
            first = r.read.get("first_bad_line")
            out.append(f"data {r.split}: training read {r.read['documents']:,} documents "
                       f"({r.read['examples']:,} examples); skipped lines: {counts}"
                       + (f" (first bad line {first})" if first else ""))
            continue
        counts = ", ".join(f"{k} {r.bad.counts.get(k, 0)}" for k in COUNTED)
        out.append(f"data {r.split}: {r.examples:,} examples; skipped lines: {counts}; "
                   f"truncated {r.truncated:,}"
                   + (f" (first bad line {r.bad.first_any()})" if r.bad.total else ""))
    return out

