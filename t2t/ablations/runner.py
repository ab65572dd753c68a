"""Runs an ablation grid's cells: pretrain -> fine-tune on each downstream task -> evaluate.

Every stage writes its own JSON when it finishes (``pretrain/stage.json``,
``finetune/<task>/stage.json``) next to its operative ``config.gin``; a cell's
``result.json`` gathers them. A finished stage is never rerun and a stopped one resumes from
its checkpoints, so a killed run continues where it stopped. A stage whose operative config
(or, for a fine-tuning, its pretraining's) changed since it ran is started again from
nothing: ``config.sha256`` in the stage directory records what it ran. Directory layout:
``<out>/<grid>/<scale>/<cell key>/seed<k>/``.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime
import glob
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import jax

from t2t.run import gin_utils
from t2t.ablations.grid import Cell, Grid
from t2t import storage
from t2t.errors import ConfigError

_log = logging.getLogger(__name__)


def stage_config(grid: Grid, lines: Sequence[str]) -> Tuple[List[str], List[str]]:
    """(gin files, bindings) of a stage: the grid file first (its macros), then the stage's
    files (lines ending in '.gin'), then its bindings and the grid's command-line ones."""
    files = [line for line in lines if line.strip().endswith(".gin")
             and not line.lstrip().startswith("include")]
    bindings = [line for line in lines if line not in files]
    return [grid.source] + files, bindings + list(grid.source_bindings)


def cell_dir(out_dir: str, grid: Grid, cell: Cell, seed: int) -> str:
    return os.path.join(out_dir, grid.name, grid.scale.name, cell.key, f"seed{seed}")


def stage_seed_dir(stage_dir: str) -> str:
    """The <out>/<grid>/<scale>/<cell>/seed<k> a stage directory (…/seed<k>/pretrain or
    …/seed<k>/finetune/<task>) belongs to."""
    parts = stage_dir.split(os.sep)
    i = max(n for n, part in enumerate(parts) if re.fullmatch(r"seed\d+", part))
    return os.sep.join(parts[:i + 1])


def pretrain_dir(out_dir: str, grid: Grid, cell: Cell, seed: int) -> str:
    """Where the cell pretrains: shared by cells whose pretraining lines are identical (BERT
    Table 5's "+ BiLSTM" only changes fine-tuning), under the first such cell's key that
    pretrains (not a control row)."""
    owner = next(c for c in grid.cells if c.pretrain == cell.pretrain and c.pretrained)
    return os.path.join(out_dir, grid.name, grid.scale.name, owner.key, f"seed{seed}",
                        "pretrain")


def hardware() -> str:
    """e.g. '8 x cpu (x86_64, 2 cores)'."""
    devices = jax.devices()
    return (f"{len(devices)} x {devices[0].platform} ({devices[0].device_kind}; "
            f"{platform.machine()}, {os.cpu_count()} cores)")


def code_version() -> str:
    """'t2t 0.1.0 @ a5748b3' in a git checkout ('+ local changes' when t2t/, its configs
    included, differs from that commit), else 't2t 0.1.0': which code a result came from,
    since a stage's fingerprint hashes its config, not the code."""
    import subprocess

    import t2t
    version = f"t2t {t2t.__version__}"
    root = os.path.dirname(os.path.dirname(os.path.abspath(t2t.__file__)))
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True)
        changes = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "t2t"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return version
    local = " + local changes" if changes.stdout.strip() else ""
    return f"{version} @ {commit.stdout.strip()}{local}"


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """The JSON file `path` (a stage's or result's record); None if there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _compute(result, wall_s: float) -> Dict[str, Any]:
    """Steps, tokens and model FLOPs of a finished `fit` (this process's share of wall)."""
    return {"steps": int(result.step), "tokens": int(result.step * result.tokens_per_step),
            "flops": float(result.step * result.flops_per_step),
            "flops_per_step": float(result.flops_per_step), "wall_s": round(wall_s, 1),
            "final_loss": next((h["loss"] for h in reversed(result.history) if "loss" in h),
                               None)}


def _model_facts(exp) -> Dict[str, Any]:
    """Parameter counts of the stage's model (all, and without the embedding table)."""
    from t2t.models.families import count_params
    model = exp.trainer.model
    config = model.config
    total = count_params(model.family, config)
    tables = 1 if config.tie_embeddings else 2          # untied: an output projection too
    embedding = tables * config.vocab_size * (config.embedding_dim or config.d_model)
    return {"family": model.family, "params": int(total),
            "nonembedding_params": int(total - embedding)}


def vocabulary_file(exp) -> Optional[str]:
    """The file name of the vocabulary the stage's task built (a vocabulary t2t trains is
    named by a digest of its corpus, so a corpus rebuilt from newer packages shows here), or
    None: a mixture, or a run that tokenised without it (BERT's fine-tunings on GLUE)."""
    vocab = getattr(exp.task, "built_vocabulary", None)
    path = getattr(vocab, "model_file", None) or getattr(vocab, "vocab_file", None)
    return os.path.basename(path) if path else None


def forward_flops_per_row(model, result) -> Dict[str, float]:
    """Forward FLOPs of one batch row by part (dense, attention, logits), at the row lengths
    `fit` counted: T5 Table 2's cost M compares these (every cell's rows hold the same
    number of tokens)."""
    from t2t.train import flops as flops_lib
    return flops_lib.forward_flops_breakdown(model.config, model.family, **result.geometry)


def fingerprint(config_str: str, upstream: str = "") -> str:
    """What a stage ran: its operative config and the fingerprint of the stage it starts
    from (a fine-tuning's pretraining)."""
    return hashlib.sha256(f"{config_str}\n{upstream}".encode()).hexdigest()


def reuse(stage_dir: str, config_str: str, sha: str,
          progress: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """The finished stage in `stage_dir` if it ran this configuration, else None after
    clearing another configuration's work (its checkpoints must not be resumed). A stage
    from before fingerprints is adopted when its config.gin is the operative config."""
    sha_path = os.path.join(stage_dir, "config.sha256")
    if _stale(stage_dir, config_str, sha):
        progress(f"{stage_dir}: its configuration changed since it ran; starting it again")
        if jax.process_index() == 0:
            shutil.rmtree(stage_dir)
    if jax.process_index() == 0:
        os.makedirs(stage_dir, exist_ok=True)
        with open(sha_path, "w") as f:
            f.write(sha)
    return read_json(os.path.join(stage_dir, "stage.json"))


def _stale(stage_dir: str, config_str: str, sha: str) -> bool:
    """Whether `stage_dir` holds another configuration's work (its fingerprint differs; a
    stage from before fingerprints: its config.gin differs)."""
    ran = read_text(os.path.join(stage_dir, "config.sha256"))
    if ran is None:             # no fingerprint yet: fresh, or a stage from before them
        old_config = read_text(os.path.join(stage_dir, "config.gin"))
        return old_config is not None and old_config != config_str
    return ran != sha


def _finished_here(stage_dir: str, config_str: str, sha: str) -> Optional[Dict[str, Any]]:
    """The finished stage `reuse` would return, read without changing anything."""
    return None if _stale(stage_dir, config_str, sha) else read_json(
        os.path.join(stage_dir, "stage.json"))


# The note `operative_config` adds under `TransformerConfig.dtype = 'auto'`: what it meant here.
_PRECISION_NOTE = re.compile(
    r"^# TransformerConfig\.dtype 'auto' resolved to '(\w+)' on this host: ([^\n]*)$",
    re.MULTILINE)
_BOUND_DTYPE = re.compile(r"^TransformerConfig\.dtype = '(\w+)'$", re.MULTILINE)


def stage_precision(config_str: str) -> Optional[str]:
    """The matmul precision a stage's operative config ran in ('bfloat16', 'float32'):
    what 'auto' resolved to on its host, else the dtype it binds; None if it says neither."""
    note = _PRECISION_NOTE.search(config_str)
    bound = _BOUND_DTYPE.search(config_str)
    return note.group(1) if note else bound.group(1) if bound else None


def ran_as_this(stage_dir: str, config_str: str, upstream: str = "") -> Optional[str]:
    """The fingerprint `stage_dir` finished under, when it ran this configuration from this
    `upstream` but wrote it otherwise, so that its fingerprint differs: on another kind of
    host, where dtype 'auto' resolved otherwise (bfloat16 on a CPU with AVX512-BF16/AMX,
    float32 on an AVX2-only one), or under an older t2t whose `TransformerConfig` lacked
    fields this one lists at their defaults (`_without_newer_defaults`). A finished stage
    stands as it ran (its result records the precision), so a grid continues across kinds of
    host and t2t versions. A stage that stopped on another kind of host is a ConfigError:
    resuming it here would mix two precisions."""
    ran = read_text(os.path.join(stage_dir, "config.gin"))
    sha = read_text(os.path.join(stage_dir, "config.sha256"))
    if ran is None or sha != fingerprint(ran, upstream):
        return None
    ours = _without_newer_defaults(config_str, ran)
    notes = [_PRECISION_NOTE.search(text) for text in (ran, ours)]
    other_host = None not in notes and notes[0].group(0) != notes[1].group(0)
    if ((ours == config_str and not other_host)
            or _PRECISION_NOTE.sub("", ran) != _PRECISION_NOTE.sub("", ours)):
        return None
    if other_host and not os.path.exists(os.path.join(stage_dir, "stage.json")):
        theirs, here = (n.group(2).rstrip(".") for n in notes)
        raise ConfigError(
            f"{stage_dir} stopped on another kind of host, where dtype 'auto' meant {theirs}; "
            f"here it means {here}. Resume it on a host of that kind, or move the directory "
            "away to run it again here")
    return sha


# One binding of the operative config, with the lines gin wraps a long value onto.
_BINDING = re.compile(r"^([\w.]+) = ([^\n]*(?:\n[ \t]+[^\n]*)*)\n?", re.MULTILINE)


def _without_newer_defaults(config_str: str, ran: str) -> str:
    """`config_str` without its `TransformerConfig.<field> = <default>` lines for the fields
    `ran` (an older operative config, which lists every field it had) does not list: a field
    t2t added since, at its default, changes nothing the older run computed."""
    from t2t.nn.config import TransformerConfig
    known = {m.group(1) for m in _BINDING.finditer(ran)}
    defaults = {f"TransformerConfig.{f.name}": f.default
                for f in dataclasses.fields(TransformerConfig)
                if f.default is not dataclasses.MISSING}

    def newer_default(m: re.Match) -> bool:
        name = m.group(1)
        if name in known or name not in defaults:
            return False
        try:
            value = ast.literal_eval(m.group(2).strip())
        except (ValueError, SyntaxError):
            return False
        default = defaults[name]
        return value == (tuple(default) if isinstance(default, list) else default)

    return _BINDING.sub(lambda m: "" if newer_default(m) else m.group(0), config_str)


def stage_fingerprint(stage_dir: str, config_str: str, upstream: str = "") -> str:
    """The fingerprint a stage runs under: `fingerprint`'s, or the one `stage_dir` finished
    under when it ran this configuration written otherwise (`ran_as_this`)."""
    return ran_as_this(stage_dir, config_str, upstream) or fingerprint(config_str, upstream)


def result_precision(out_dir: str, grid: Grid, cell: Cell, seed: int) -> Optional[str]:
    """The precision of a finished cell's stages, 'bfloat16 + float32' if they differ (read
    from their config.gin, so results written before this field have it too)."""
    stages = [os.path.join(cell_dir(out_dir, grid, cell, seed), "finetune", task)
              for task, _ in grid.scale.tasks]
    if cell.pretrained:
        stages.insert(0, pretrain_dir(out_dir, grid, cell, seed))
    found = {stage_precision(read_text(os.path.join(d, "config.gin")) or "") for d in stages}
    found.discard(None)
    return " + ".join(sorted(found)) or None


def twin_pretraining(out_dir: str, grid: Grid, seed: int, model_dir: str,
                     config_str: str) -> Optional[str]:
    """A finished pretraining of another grid under `out_dir` (same scale and seed) that
    ran this configuration, its directory aside: T5 Tables 5-7 share Table 2's baseline."""
    return _finished_elsewhere(out_dir, grid, seed, "pretrain", model_dir, config_str, "")


def twin_finetuning(out_dir: str, grid: Grid, seed: int, task: str, model_dir: str,
                    pretrain_twin: str, config_str: str, tail: str) -> Optional[str]:
    """A finished fine-tuning on `task` from the pretraining ours was copied from
    (`pretrain_twin`), if it ran this configuration (`tail`: the split and eval size of our
    fingerprint), in any cell under `out_dir`: beside that pretraining, or elsewhere (a
    learning curve's rows share one pretraining, and its last row's fine-tuning sits in its
    own cell)."""
    upstream = f"{read_text(os.path.join(pretrain_twin, 'config.sha256'))} {tail}"
    return _finished_elsewhere(out_dir, grid, seed, os.path.join("finetune", task), model_dir,
                               config_str, upstream)


def twin_control(out_dir: str, grid: Grid, seed: int, task: str, model_dir: str,
                 config_str: str, upstream: str) -> Optional[str]:
    """A finished fine-tuning from random initialisation on `task` in any grid under
    `out_dir` (same scale and seed) that ran this configuration: T5 Tables 5-7's control
    rows are one run."""
    return _finished_elsewhere(out_dir, grid, seed, os.path.join("finetune", task),
                               model_dir, config_str, upstream)


def _finished_elsewhere(out_dir: str, grid: Grid, seed: int, stage: str, model_dir: str,
                        config_str: str, upstream: str) -> Optional[str]:
    """The first `<out>/<any grid>/<scale>/<any cell>/seed<k>/<stage>` other than
    `model_dir` that finished a run of `config_str` from `upstream`."""
    pattern = os.path.join(out_dir, "*", grid.scale.name, "*", f"seed{seed}", stage)
    for other in sorted(glob.glob(pattern)):
        if (os.path.abspath(other) != os.path.abspath(model_dir)
                and _finished_as(other, config_str, upstream)):
            return other
    return None


def _finished_as(stage_dir: str, config_str: str, upstream: str) -> bool:
    """Whether `stage_dir` finished a run of `config_str` (its own directories aside, and in
    the same precision: why 'auto' resolved to it on that host, an AVX2-only or an
    AVX-512 CPU's float32, does not matter) and is not stale (its fingerprint is that of its
    config.gin and `upstream`)."""
    text = read_text(os.path.join(stage_dir, "config.gin"))
    return (text is not None and os.path.exists(os.path.join(stage_dir, "stage.json"))
            and read_text(os.path.join(stage_dir, "config.sha256")) == fingerprint(text,
                                                                                   upstream)
            and _what_ran(text) == _what_ran(config_str))


def _copy_stage(twin: str, stage_dir: str, sha: str) -> Dict[str, Any]:
    """`twin`'s finished stage copied into `stage_dir` under our fingerprint, marked."""
    stage = {**read_json(os.path.join(twin, "stage.json")), "copied_from": twin}
    if jax.process_index() == 0:
        shutil.copytree(twin, stage_dir, dirs_exist_ok=True)
        with open(os.path.join(stage_dir, "config.sha256"), "w") as f:
            f.write(sha)
        storage.write_json_atomically(os.path.join(stage_dir, "stage.json"), stage)
    return stage


# A stage's own directories in its operative config, with the lines gin wraps a long path onto.
_DIR_BINDINGS = re.compile(r"^(MODEL_DIR|INITIAL_CHECKPOINT) = [^\n]*(?:\n[ \t]+[^\n]*)*",
                           re.MULTILINE)


def _without_dirs(config_str: str) -> str:
    return _DIR_BINDINGS.sub(r"\1 = <dir>", config_str)


def _what_ran(config_str: str) -> str:
    """What `config_str` ran: without its stage's directories, or why its host chose its
    precision."""
    return _PRECISION_NOTE.sub(r"# dtype 'auto' resolved to '\1'", _without_dirs(config_str))


def read_text(path: str) -> Optional[str]:
    """The text of `path` (a stage's config.gin or fingerprint); None if there is none."""
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return f.read()


def _pretrain_config(grid: Grid, cell: Cell, seed: int, model_dir: str) -> Tuple[Any, str, str]:
    """(experiment, operative config, fingerprint) of the cell's pretraining in `model_dir`
    (gin is left bound to it)."""
    from t2t.run import experiment as experiment_lib
    files, bindings = stage_config(grid, grid.scale.pretrain + cell.pretrain)
    gin_utils.parse(files, bindings + [f"MODEL_DIR = {model_dir!r}", f"SEED = {seed}"])
    exp = experiment_lib.experiment()
    config_str = experiment_lib.operative_config(exp)
    return exp, config_str, stage_fingerprint(model_dir, config_str)


def _scored_as(grid: Grid, task: str) -> str:
    """How a fine-tuning on `task` is scored (the split, how many examples): its fingerprint
    holds this after the pretraining's."""
    return f"{grid.scale.split_of(task)} {grid.scale.eval_examples}"


def _finetune_config(grid: Grid, cell: Cell, seed: int, task: str,
                     pretrained_dir: Optional[str], model_dir: str,
                     pretrained_sha: str) -> Tuple[Any, str, str]:
    """(experiment, operative config, fingerprint) of the cell's fine-tuning on `task` in
    `model_dir` from `pretrained_dir` (None: random initialisation)."""
    from t2t.run import experiment as experiment_lib
    from t2t.run import finetune as finetune_lib
    files, bindings = stage_config(grid, grid.scale.finetune_lines(task) + cell.finetune)
    gin_utils.parse(files, bindings + [
        f"MODEL_DIR = {model_dir!r}", f"INITIAL_CHECKPOINT = {pretrained_dir!r}",
        f"MIXTURE_OR_TASK_NAME = {task!r}", f"SEED = {seed}",
        f"evaluate_experiment.max_examples = {grid.scale.eval_examples!r}"])
    exp = finetune_lib.finetune_experiment()
    config_str = experiment_lib.operative_config(exp)
    upstream = f"{pretrained_sha} {_scored_as(grid, task)}"
    return exp, config_str, stage_fingerprint(model_dir, config_str, upstream)


def _finetune_twin(grid: Grid, seed: int, task: str, model_dir: str, config_str: str,
                   pretrained_dir: Optional[str], pretrained_sha: str,
                   pretrain_twin: Optional[str], out_dir: Optional[str]) -> Optional[str]:
    """The finished fine-tuning elsewhere under `out_dir` that ours would copy: the same
    run from the pretraining ours was copied from, or (from random initialisation) another
    grid's identical control."""
    if not out_dir:
        return None
    tail = _scored_as(grid, task)
    twin = pretrain_twin and twin_finetuning(out_dir, grid, seed, task, model_dir,
                                             pretrain_twin, config_str, tail)
    if not twin and pretrained_dir is None:
        twin = twin_control(out_dir, grid, seed, task, model_dir, config_str,
                            f"{pretrained_sha} {tail}")
    return twin or None


def pretrain(grid: Grid, cell: Cell, seed: int, model_dir: str,
             progress: Callable[[str], None] = print,
             out_dir: Optional[str] = None) -> Tuple[Dict[str, Any], str]:
    """(stage, fingerprint): the cell's pretraining (resumed, or reused when it finished
    with this configuration, or copied from another grid's under `out_dir` that did),
    then the scale's held-out score if it has one."""
    from t2t.run import experiment as experiment_lib
    from t2t.train.trainer import fit
    exp, config_str, sha = _pretrain_config(grid, cell, seed, model_dir)
    stage = reuse(model_dir, config_str, sha, progress)
    if stage is not None:
        return stage, sha
    twin = out_dir and twin_pretraining(out_dir, grid, seed, model_dir, config_str)
    if twin:
        progress(f"pretraining: the same configuration finished in {twin}; copying it")
        stage = _copy_stage(twin, model_dir, sha)
        experiment_lib.write_operative_config(exp)
        return stage, sha
    progress("pretraining")
    experiment_lib.write_operative_config(exp)
    start, cpu = time.perf_counter(), time.process_time()
    early = _early_heldout(grid, exp, model_dir, config_str, progress)
    if early is not None and early.get("stopped_by") == "preempted":
        return early, sha
    result = fit(exp.trainer, exp.data(), config_str=config_str)
    stage = {**_compute(result, time.perf_counter() - start), **_model_facts(exp),
             "stopped_by": result.stopped_by, "cpu_s": round(time.process_time() - cpu, 1),
             "vocabulary": vocabulary_file(exp)}
    stage["forward_flops_per_row"] = forward_flops_per_row(exp.trainer.model, result)
    if grid.scale.heldout and result.stopped_by == "done":
        stage["heldout"] = _score_heldout(grid, exp, result.state.params)
        stage["heldout"]["unigram"] = _unigram_baseline(exp)
        if early is not None:
            stage["heldout_early"] = early
    if stage["stopped_by"] == "done":
        storage.write_json_atomically(os.path.join(model_dir, "stage.json"), stage)
    return stage, sha


def _score_heldout(grid: Grid, exp, params) -> Dict[str, Any]:
    """The scale's held-out task scored on its whole split, with its wall and CPU seconds."""
    from t2t.data import tasks as tasks_lib
    start, cpu = time.perf_counter(), time.process_time()
    task, metric = grid.scale.heldout
    exp.eval_task = tasks_lib.get_task(task)
    scores = exp.trainer.evaluate(params, exp.eval_data(), steps=None)
    return {"task": task, "metric": metric, **scores,
            "wall_s": round(time.perf_counter() - start, 1),
            "cpu_s": round(time.process_time() - cpu, 1)}


def _unigram_baseline(exp) -> Dict[str, Any]:
    """The held-out task scored by the training targets' frequencies alone
    (`t2t.evaluation.unigram`; `exp.eval_task` is the held-out task): the floor a held-out
    perplexity is read against."""
    from t2t.evaluation import unigram
    counts = unigram.training_counts(exp)
    return {"loss": unigram.unigram_loss(counts, exp.eval_data()),
            "train_targets": int(counts.sum())}


def _early_heldout(grid: Grid, exp, model_dir: str, config_str: str,
                   progress: Callable[[str], None]) -> Optional[Dict[str, Any]]:
    """With the scale's `heldout_early` step (Narang et al.'s "early loss"): train to that
    step (it checkpoints there), score the held-out task, and leave the rest of the
    pretraining to the caller's `fit`, which resumes from that checkpoint. The score is
    kept in `early.json`, so a resumed stage does not train or score it again."""
    from t2t.train.trainer import fit
    step = grid.scale.heldout_early
    if not (grid.scale.heldout and step):
        return None
    path = os.path.join(model_dir, "early.json")
    done = read_json(path)
    if done is not None:
        return done
    full = exp.trainer.config
    exp.trainer.config = dataclasses.replace(full, train_steps=step)
    try:
        result = fit(exp.trainer, exp.data(), config_str=config_str)
    finally:
        exp.trainer.config = full
    if result.stopped_by != "done":
        return {"stopped_by": result.stopped_by}
    progress(f"held-out score at step {step}")
    early = {"step": step, **_score_heldout(grid, exp, result.state.params)}
    storage.write_json_atomically(path, early)
    return early


def finetune(grid: Grid, cell: Cell, seed: int, task: str, pretrained_dir: Optional[str],
             model_dir: str, pretrained_sha: str = "",
             progress: Callable[[str], None] = print,
             pretrain_twin: Optional[str] = None,
             out_dir: Optional[str] = None) -> Dict[str, Any]:
    """Fine-tune the pretrained cell on `task` and score the scale's split (or reuse the
    finished stage when neither its configuration nor its pretraining changed, or copy
    the same fine-tuning of `pretrain_twin`, the pretraining ours was copied from).
    `pretrained_dir` None: from random initialisation (a control row)."""
    from t2t.run import experiment as experiment_lib
    from t2t.run import finetune as finetune_lib
    exp, config_str, sha = _finetune_config(grid, cell, seed, task, pretrained_dir, model_dir,
                                            pretrained_sha)
    split = grid.scale.split_of(task)
    stage = reuse(model_dir, config_str, sha, progress)
    if stage is not None:
        return stage
    twin = _finetune_twin(grid, seed, task, model_dir, config_str, pretrained_dir,
                          pretrained_sha, pretrain_twin, out_dir)
    if twin:
        progress(f"fine-tuning on {task}: the same run finished in {twin}; copying it")
        stage = _copy_stage(twin, model_dir, sha)
        experiment_lib.write_operative_config(exp)
        return stage
    progress(f"fine-tuning on {task}")
    cpu = time.process_time()
    out = finetune_lib.run([split], exp=exp)
    if out["metrics"] is None:
        return {"stopped_by": "preempted"}
    stage = _compute(out["result"], out["train_seconds"])
    stage.update(eval_s=round(out["eval_seconds"], 1), stopped_by="done", split=split,
                 metrics=out["metrics"][f"{task}/{split}"], vocabulary=vocabulary_file(exp),
                 cpu_s=round(time.process_time() - cpu, 1))   # training and scoring
    storage.write_json_atomically(os.path.join(model_dir, "stage.json"), stage)
    return stage


# The pretraining stage of a control row, which has none (the table's compute columns read it).
RANDOM_INIT = {"stopped_by": "done", "random_init": True, "steps": 0, "tokens": 0,
               "flops": 0.0, "wall_s": 0.0, "cpu_s": 0.0}
# What a control row's fine-tunings record as the fingerprint of the pretraining they start
# from (with `_upstream_sha`'s step: "random-init@0").
RANDOM_INIT_SHA = "random-init"


def _start_dir(cell: Cell, pre_dir: str) -> str:
    """The directory the cell fine-tunes from: `pre_dir`, or its kept step `from_step`."""
    return pre_dir if cell.from_step is None else os.path.join(pre_dir, "checkpoints",
                                                               str(cell.from_step))


def _upstream_sha(cell: Cell, pre_sha: str) -> str:
    """The pretraining fingerprint a cell's fine-tunings record (with the step it took)."""
    return pre_sha if cell.from_step is None else f"{pre_sha}@{cell.from_step}"


def initial_checkpoint(cell: Cell, pre_dir: str) -> str:
    """What the cell fine-tunes from: the pretraining's MODEL_DIR (its last step), or the
    directory of step `cell.from_step` (a learning curve), which must have been kept."""
    step_dir = _start_dir(cell, pre_dir)
    if cell.from_step is not None and not os.path.isdir(step_dir):
        steps_dir = os.path.join(pre_dir, "checkpoints")
        kept = sorted(int(d) for d in os.listdir(steps_dir) if d.isdigit()) \
            if os.path.isdir(steps_dir) else []
        raise ConfigError(f"cell {cell.label!r} fine-tunes from pretraining step "
                          f"{cell.from_step}, but {pre_dir} kept checkpoints {kept}: make the "
                          "scale's TrainConfig.checkpoint_every divide it and keep_checkpoints "
                          "hold it")
    return step_dir


def run_cell(grid: Grid, cell: Cell, seed: int, out_dir: str,
             progress: Callable[[str], None] = print) -> Dict[str, Any]:
    """One cell at one seed, every finished stage of the same configuration reused;
    returns its result."""
    root = cell_dir(out_dir, grid, cell, seed)

    def say(message: str) -> None:
        progress(f"{cell.label} (seed {seed}): {message}")

    if cell.pretrained:
        pre_dir = pretrain_dir(out_dir, grid, cell, seed)
        pre, pre_sha = pretrain(grid, cell, seed, pre_dir, say, out_dir)
        if pre["stopped_by"] != "done":
            return {"stopped_by": pre["stopped_by"]}
        start_from = initial_checkpoint(cell, pre_dir)
    else:
        pre, pre_sha, start_from = dict(RANDOM_INIT), RANDOM_INIT_SHA, None
    downstream = {}
    for task, _ in grid.scale.tasks:
        stage = finetune(grid, cell, seed, task, start_from,
                         os.path.join(root, "finetune", task), _upstream_sha(cell, pre_sha),
                         say, pre.get("copied_from") if cell.from_step is None else None,
                         out_dir)
        if stage["stopped_by"] != "done":
            return {"stopped_by": stage["stopped_by"]}
        downstream[task] = stage
    done = read_json(os.path.join(root, "result.json"))
    if done is not None and done["pretrain"] == pre and done["finetune"] == downstream:
        say("cached")
        return done
    stages = ([pre] if cell.pretrained else []) + list(downstream.values())
    result = {"grid": grid.name, "scale": grid.scale.name, "cell": cell.key,
              "labels": dict(cell.labels), "label": cell.label, "seed": seed,
              "pretrain": pre, "finetune": downstream,
              "precision": result_precision(out_dir, grid, cell, seed),
              **({} if cell.from_step is None else {"from_step": cell.from_step}),
              **(_where_copies_ran(stages) or {
                  "hardware": hardware(), "code": code_version(),
                  "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(
                      timespec="seconds")})}
    if jax.process_index() == 0:
        storage.write_json_atomically(os.path.join(root, "result.json"), result)
    return result


def _where_copies_ran(stages: Sequence[Dict[str, Any]]) -> Optional[Dict[str, str]]:
    """{hardware, code, finished} of the runs a cell's stages were all copied from (read from
    their cells' result.json; the latest finish), so a copied row says where and when it ran;
    None when a stage trained here or a twin's result cannot be read."""
    twins = [stage.get("copied_from") for stage in stages]
    if not twins or None in twins:
        return None
    ran = [read_json(os.path.join(stage_seed_dir(twin), "result.json")) for twin in twins]
    if None in ran:
        return None
    return {"hardware": " + ".join(sorted({r["hardware"] for r in ran})),
            "code": " + ".join(sorted({r.get("code", "–") for r in ran})),
            "finished": max(r["finished"] for r in ran)}


# `plan_cell`: a stage this cell already finished, to be reused.
FINISHED = "finished"


def plan_cell(grid: Grid, cell: Cell, seed: int, out_dir: str) -> Dict[str, Optional[str]]:
    """What `run_cell` would do at `seed`, found without training or changing anything:
    {stage: FINISHED (its own, reused), the directory of another grid's identical finished
    stage (copied), or None (trains here)} for 'pretrain' (pretrained cells) and
    'finetune/<task>' for each of the scale's tasks. Leaves gin bound to the last stage."""
    tasks = [f"finetune/{task}" for task, _ in grid.scale.tasks]
    plan: Dict[str, Optional[str]] = {}
    pretrain_twin, pre_sha, start_from = None, RANDOM_INIT_SHA, None
    if cell.pretrained:
        pre_dir = pretrain_dir(out_dir, grid, cell, seed)
        _, config_str, pre_sha = _pretrain_config(grid, cell, seed, pre_dir)
        own = _finished_here(pre_dir, config_str, pre_sha)
        twin = None if own else twin_pretraining(out_dir, grid, seed, pre_dir, config_str)
        plan["pretrain"] = FINISHED if own else twin
        if plan["pretrain"] is None:              # trained here: so are its fine-tunings
            return {**plan, **dict.fromkeys(tasks)}
        if cell.from_step is None:
            pretrain_twin = own.get("copied_from") if own else twin
        start_from = _start_dir(cell, pre_dir)
    pre_sha = _upstream_sha(cell, pre_sha)
    root = cell_dir(out_dir, grid, cell, seed)
    for (task, _), stage in zip(grid.scale.tasks, tasks):
        model_dir = os.path.join(root, "finetune", task)
        _, config_str, sha = _finetune_config(grid, cell, seed, task, start_from, model_dir,
                                              pre_sha)
        plan[stage] = (FINISHED if _finished_here(model_dir, config_str, sha) else
                       _finetune_twin(grid, seed, task, model_dir, config_str, start_from,
                                      pre_sha, pretrain_twin, out_dir))
    return plan


def plan_grid(grid: Grid, cells: Sequence[Cell], seeds: Sequence[int],
              out_dir: str) -> Dict[Tuple[str, int], Dict[str, Any]]:
    """`plan_cell` for each selected (cell, seed), finished ones too (a finished seed whose
    stages would not all be reused ran under an earlier configuration). A pretraining that
    cells share (BERT Table 5's two LTR rows) trains once: the later cells' plans name its
    directory instead of None."""
    plans, trains = {}, set()
    with gin_utils.reuse_file_parses():
        for seed in seeds:
            for cell in cells:
                plan = plan_cell(grid, cell, seed, out_dir)
                if cell.pretrained and plan["pretrain"] is None:
                    pre_dir = pretrain_dir(out_dir, grid, cell, seed)
                    plan["pretrain"] = pre_dir if pre_dir in trains else None
                    trains.add(pre_dir)
                plans[cell.key, seed] = plan
    return plans


def stage_cpu_seconds(out_dir: str, grid: Grid) -> Dict[str, List[float]]:
    """CPU seconds of the grid's finished stages that trained (not copied) under `out_dir`,
    by stage: 'pretrain' (with its held-out scores) and 'finetune/<task>'."""
    found: Dict[str, List[float]] = {}
    for seed_dir in glob.glob(os.path.join(out_dir, grid.name, grid.scale.name, "*", "seed*")):
        stages = [("pretrain", os.path.join(seed_dir, "pretrain"))] + [
            (f"finetune/{os.path.basename(d)}", d)
            for d in glob.glob(os.path.join(seed_dir, "finetune", "*"))]
        for name, stage_dir in stages:
            stage = read_json(os.path.join(stage_dir, "stage.json"))
            cpu = None if stage is None or "copied_from" in stage else stage_cpu_s(stage)
            if cpu is not None:
                found.setdefault(name, []).append(cpu)
    return found


def stage_cpu_s(stage: Dict[str, Any]) -> Optional[float]:
    """CPU seconds of a finished stage, its held-out scores included; None where the runner
    did not record them."""
    if stage.get("cpu_s") is None:
        return None
    return stage["cpu_s"] + sum(stage[k].get("cpu_s", 0.0) for k in ("heldout", "heldout_early")
                                if k in stage)


def shard(items: Sequence[Any], spec: Optional[str]) -> List[Any]:
    """`'i/n'`: every n-th item starting at i (so n hosts split a grid); None: all."""
    if not spec:
        return list(items)
    try:
        i, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise ConfigError(f"--shard takes i/n such as 0/4, got {spec!r}") from None
    if not 0 <= i < n:
        raise ConfigError(f"--shard {spec}: need 0 <= i < n")
    return list(items)[i::n]


def run_grid(grid: Grid, out_dir: str, cells: Sequence[Cell], seeds: Sequence[int],
             shard_spec: Optional[str] = None) -> List[Dict[str, Any]]:
    """Every (cell, seed) of the selection, in order (this shard's share of them). A
    preempted stage (SIGTERM, Ctrl-C: saved) stops the grid there; the last result then
    says ``stopped_by: "preempted"`` and a rerun resumes that stage."""
    work = shard([(c, s) for s in seeds for c in cells], shard_spec)
    results = []
    for n, (cell, seed) in enumerate(work, 1):
        def progress(message: str, n=n) -> None:
            print(f"[{grid.name} {grid.scale.name} {n}/{len(work)}] {message}", flush=True)
        start = time.perf_counter()
        results.append(run_cell(grid, cell, seed, out_dir, progress))
        if results[-1].get("stopped_by") == "preempted":
            progress(f"{cell.label} (seed {seed}): preempted, saved; rerun to resume")
            break
        progress(f"{cell.label} (seed {seed}): {time.perf_counter() - start:.0f} s")
    return results


def load_results(grid: Grid, out_dir: str) -> Dict[str, List[Dict[str, Any]]]:
    """{cell key: [result per finished seed]} for the grid's cells."""
    found = {}
    for cell in grid.cells:
        root = os.path.dirname(cell_dir(out_dir, grid, cell, 0))
        seeds = sorted(d for d in os.listdir(root) if d.startswith("seed")) if \
            os.path.isdir(root) else []
        found[cell.key] = [r for r in (read_json(os.path.join(root, d, "result.json"))
                                       for d in seeds) if r is not None]
        for r in found[cell.key]:
            if "precision" not in r:        # a result from before the field
                r["precision"] = result_precision(out_dir, grid, cell, r["seed"])
    return found
