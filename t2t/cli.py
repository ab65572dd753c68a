"""The `t2t` command line: one entry point, one subcommand per job."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import tempfile
import traceback
from typing import List, Optional

from t2t.errors import (EXIT_DISK_FULL, EXIT_INTERNAL, EXIT_PREEMPTED, EXIT_USAGE, DiskFullError,
                        UserError)

ABLATION_OUT_DIR = "runs/ablations"   # `t2t ablate --out_dir` default
ERROR_LOG = os.path.join(tempfile.gettempdir(), "t2t-error.log")   # the last error's traceback


def _parse_gin(args, required=("MODEL_DIR",)) -> None:
    """Parse the command's gin files and bindings; a command-line macro the config does not
    use, or a `required` macro left unset, is one ConfigError before anything compiles.
    Without --gin_file the run's own operative config, MODEL_DIR/config.gin, is the config
    (`t2t eval --gin.MODEL_DIR=runs/x`), the command line's bindings on top of it."""
    from t2t.run import gin_utils
    bindings = args.gin + args.gin_bindings
    gin_utils.parse(args.gin_file or [_run_config(args.command, bindings)], bindings)
    gin_utils.check_bindings(bindings, required)


def _run_config(command: str, bindings: List[str]) -> str:
    """MODEL_DIR/config.gin for a command given no --gin_file (MODEL_DIR from `bindings`);
    a ConfigError in one line when there is none."""
    from t2t import storage
    from t2t.errors import ConfigError
    from t2t.run import gin_utils
    gin_utils.parse([], bindings)               # bindings alone: where MODEL_DIR is
    model_dir = gin_utils.query_macro("MODEL_DIR")
    if not isinstance(model_dir, str) or not model_dir:
        raise ConfigError(f"t2t {command} needs --gin_file=..., or --gin.MODEL_DIR=<a run's "
                          "directory> to use the run's own config (MODEL_DIR/config.gin)")
    storage.check(model_dir)                       # gs:// without gcsfs: one line
    config_gin = os.path.join(model_dir, "config.gin")
    if not storage.path(config_gin).is_file():
        where = "does not exist" if not storage.path(model_dir).is_dir() else \
            "has no config.gin (it is written when a run starts)"
        raise ConfigError(f"MODEL_DIR {model_dir!r} {where}: check the path, or give the "
                          "run's --gin_file=... flags")
    if storage.is_remote(model_dir):               # gin reads local files: a local copy
        local = os.path.join(tempfile.mkdtemp(prefix="t2t-run-config-"), "config.gin")
        with open(local, "w", encoding="utf-8") as f:
            f.write(storage.path(config_gin).read_text())
        return local
    return config_gin


def _model_from_gin(gin_files: List[str], bindings: List[str]):
    from t2t.run import gin_utils
    from t2t.run.configurables import model_config
    gin_utils.parse(gin_files, bindings)
    gin_utils.check_bindings(bindings, required=())
    family = gin_utils.query_macro("MODEL_FAMILY")
    if family is None:
        raise SystemExit(f"{gin_files}: no MODEL_FAMILY macro; include a configs/models/* file")
    return family, model_config(family)


def cmd_params(args) -> int:
    """Print the parameter count of each model config (no weights are allocated)."""
    from t2t.models.families import count_params
    for gin_file in args.gin_file:
        family, config = _model_from_gin([gin_file], args.gin + args.gin_bindings)
        print(f"{gin_file:40s} {family:5s} {count_params(family, config):>15,d}")
    return 0


def cmd_forward(args) -> int:
    """Initialise each model config and run one forward pass; print shapes and counts."""
    import jax
    import flax.linen as nn
    from t2t.models.families import count_params, example_inputs, make_module
    for gin_file in args.gin_file:
        family, config = _model_from_gin([gin_file], args.gin + args.gin_bindings)
        module = make_module(family, config)
        inputs = example_inputs(family, batch=args.batch, length=args.length)
        params = nn.unbox(module.init(jax.random.PRNGKey(0), **inputs)["params"])
        out = module.apply({"params": params}, **inputs)
        shapes = ({k: v.shape for k, v in out.items()} if isinstance(out, dict) else out.shape)
        print(f"{gin_file}: {family}, {count_params(family, config):,d} params, "
              f"inputs {{{', '.join(f'{k}: {v.shape}' for k, v in inputs.items())}}} -> {shapes}")
    return 0


def _gin_args(argv: List[str]):
    """Split `--gin.NAME=value` flags (t5x style) from the rest of argv."""
    from t2t.run import gin_utils
    bindings, rest = [], []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin."):].split("=", 1)
            bindings.append(gin_utils.macro_binding(name, value))
        else:
            rest.append(arg)
    return bindings, rest


def cmd_train(args) -> int:
    """`t2t train --gin_file=... [--gin.MACRO=value ...]`: the gin-wired training run."""
    from t2t.train import distributed
    from t2t.run import experiment
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    _parse_gin(args)
    with _model_dir_lock(args):
        result = experiment.run()
    return EXIT_PREEMPTED if result.stopped_by == "preempted" else 0


def _model_dir_lock(args):
    """MODEL_DIR/.t2t.lock for the run (t2t.train.run_lock): one run per MODEL_DIR."""
    from t2t.run import gin_utils
    from t2t.train import run_lock
    model_dir = gin_utils.query_macro("MODEL_DIR")
    if not isinstance(model_dir, str) or not model_dir:   # the run itself says what is wrong
        return contextlib.nullcontext()
    command = " ".join(["t2t", *map(shlex.quote, getattr(args, "argv", [args.command]))])
    return run_lock.model_dir_lock(model_dir, command)


def _parse_finetune_gin(args, required=("MODEL_DIR",)) -> None:
    from t2t.run import finetune  # noqa: F401  registers its configurables
    _parse_gin(args, required)


def cmd_finetune(args) -> int:
    """`t2t finetune --gin_file=... --gin.MODEL_DIR=... --gin.INITIAL_CHECKPOINT=...`."""
    from t2t.train import distributed
    from t2t.run import finetune
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    _parse_finetune_gin(args, required=("MODEL_DIR", "INITIAL_CHECKPOINT"))
    with _model_dir_lock(args):
        out = finetune.run(args.split or None)
    return EXIT_PREEMPTED if out["result"].stopped_by == "preempted" else 0


def cmd_eval(args) -> int:
    """`t2t eval --gin.MODEL_DIR=... [--split test]`: score the latest checkpoint with the
    run's own config (or --gin_file=...); metrics.json + results.md into --output_dir
    (default MODEL_DIR)."""
    from t2t.run import finetune
    _parse_finetune_gin(args)
    finetune.evaluate_run(args.split or None, args.output_dir)
    return 0


def cmd_infer(args) -> int:
    """`t2t infer --gin.MODEL_DIR=... [--input FILE]`: one output line per input line (stdin
    by default), with the run's own config (or --gin_file=...)."""
    from t2t.run import finetune
    _parse_finetune_gin(args)
    lines = read_input_lines(args.input)
    exp, params = finetune.restore_experiment()
    options = {"beam": {"beam_size": args.beam_size, "alpha": args.alpha,
                        "finish_in_beam": args.finish_in_beam},
               "greedy": {}}[args.strategy]
    prefix = None if args.raw else getattr(exp.task, "input_prefix", None)
    if prefix:
        print(f"inputs start with the task's {prefix!r} (--raw: as given)", file=sys.stderr)
    texts = [n for n, line in enumerate(lines) if line.strip()]   # blank lines stay blank
    if len(texts) < len(lines):
        print(f"{len(lines) - len(texts)} blank input line(s): blank output line(s)",
              file=sys.stderr)
    decoded = finetune.infer_lines(exp, params, [lines[n] for n in texts],
                                   batch_size=args.batch_size,
                                   max_decode_length=args.max_decode_length,
                                   prefix=prefix, strategy=args.strategy, **options) \
        if texts else []
    outputs = [""] * len(lines)
    for n, text in zip(texts, decoded):
        outputs[n] = " ".join(str(text).split())
    out = sys.stdout if args.output in (None, "-") else open(args.output, "w")
    for text in outputs:
        print(text, file=out)
    if out is not sys.stdout:
        out.close()
    return 0


def read_input_lines(path: Optional[str]) -> List[str]:
    """The lines of `path` (stdin for None or "-") as UTF-8 text; a file that is not UTF-8
    or has no line is an InputFileError naming the file and the line."""
    from t2t.errors import InputFileError
    name = "standard input" if path in (None, "-") else path
    if path in (None, "-"):
        stdin = getattr(sys.stdin, "buffer", None)    # a text stream without one: as it is
        data = stdin.read() if stdin is not None else sys.stdin.read().encode("utf-8")
    else:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise InputFileError(f"cannot read --input {path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise InputFileError(f"{name}, line {line}: byte 0x{data[e.start]:02x} is not UTF-8; "
                             "convert the file, e.g. iconv -f latin1 -t utf-8") from None
    lines = text.splitlines()
    if not lines:
        raise InputFileError(f"{name} is empty: give one input per line")
    return lines


def cmd_compile(args) -> int:
    """`t2t compile --gin_file=... --topology=v5e-256 [--num_slices N] [--step train]`:
    compile the step `t2t train` would run for a TPU slice, without one; print its per-chip
    memory and FLOPs. Exit 0 if it fits in HBM, 1 if not."""
    import jax
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")   # the host runs nothing; libtpu compiles
    from t2t.run import aot, finetune  # noqa: F401  finetune registers its configurables
    aot.parse_gin(args.gin_file, args.gin + args.gin_bindings)
    topology, num_slices = aot.target_from_config(args.topology, args.num_slices)
    report = aot.compile_for(topology, num_slices, args.step)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=1)
    print("\n".join(report.lines()))
    return 0 if report.fits else 1


def cmd_convert(args) -> int:
    """`t2t convert SRC OUT`: a Hugging Face directory (BERT, RoBERTa, ALBERT, ELECTRA,
    DistilBERT, GPT-2, T5) read and written back by t2t, or a t2t MODEL_DIR (its config.gin
    and latest checkpoint) written as Hugging Face `--model_type` directories. `--long N`
    makes a RoBERTa a Longformer of N positions (`t2t.convert.hf_longformer.long_roberta`)."""
    from t2t.convert import pretrained as hf_pretrained
    from t2t.run import model_dir
    families = ", ".join(hf_pretrained.SUPPORTED)
    if os.path.isdir(args.src) and model_dir.is_t2t_model_dir(args.src) \
            and not model_dir.is_hf_dir(args.src):
        if not args.model_type:
            raise UserError(f"{args.src!r} is a t2t MODEL_DIR: name the Hugging Face family "
                            f"with --model_type ({families})")
        if args.model_type not in hf_pretrained.SUPPORTED:
            raise UserError(f"--model_type {args.model_type!r} is not supported; choose one "
                            f"of {families}")
    loaded = model_dir.load_model_dir(args.src, step=args.step)
    if loaded.is_hf:
        models = {"model": loaded.pretrained}
    else:
        from t2t.run import configurables as configured
        generator = configured.generator_config(hf_pretrained.family_of(args.model_type),
                                                loaded.config)
        models = hf_pretrained.from_t2t(args.model_type, loaded.config, loaded.params,
                                        generator)
    if args.long:
        from t2t.convert.hf_longformer import long_roberta
        models = {name: long_roberta(model, args.long, args.window)
                  for name, model in models.items()}
    for name, model in models.items():
        out = args.out if len(models) == 1 else os.path.join(args.out, name)
        hf_pretrained.save_pretrained(model, out)
        import jax
        count = sum(x.size for x in jax.tree.leaves(model.params))
        print(f"{out}: {model.architecture} ({model.model_type}), {count:,d} parameters")
    return 0


def cmd_mlm_eval(args) -> int:
    """`t2t mlm_eval RUN...`: BERT and its successors compared on the same masked tokens
    (t2t/run/encoder_eval.py)."""
    from t2t.run import encoder_eval
    encoder_eval.evaluate_runs(args.model_dirs, args.task, args.batches, args.finetune,
                               args.finetune_steps, args.seed, args.json)
    return 0


def _seed_list(text: str) -> List[int]:
    """`--seeds 0,1,2` -> [0, 1, 2]; argparse says what is wrong with anything else."""
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"takes comma-separated whole numbers such as 0,1,2, got {text!r}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"seeds are 0 or more, got {text!r}")
    return seeds


def _plan_ablation(args, grid, cells, seeds) -> int:
    """`t2t ablate GRID --scale=paper --plan --hardware=tpu_v5e_256`: what the grid costs."""
    import jax
    if not os.environ.get("JAX_PLATFORMS"):
        jax.config.update("jax_platforms", "cpu")   # the host runs nothing; libtpu compiles
    from t2t.ablations import cost
    from t2t.run import finetune  # noqa: F401  finetune registers its configurables
    hardware = args.hardware or next(
        (line.strip()[len("hardware/"):-len(".gin")] for line in grid.scale.pretrain
         if line.strip().startswith("hardware/tpu_")), None)
    if not hardware:
        raise UserError(f"--plan needs --hardware=<a TPU config in configs/hardware, such as "
                        f"tpu_v5e_256>: scale {grid.scale.name!r} runs on no TPU slice")
    cache = args.plan_cache or os.path.join(args.out_dir, "plan_cache.json")
    t2t_log = logging.getLogger("t2t")
    level = t2t_log.level
    t2t_log.setLevel(logging.WARNING)       # each stage's config logs its vocabulary size
    try:
        plan = cost.plan_grid(grid, cells, len(seeds), hardware, cache, args.out_dir,
                              say=lambda m: print(m, file=sys.stderr, flush=True))
    finally:
        t2t_log.setLevel(level)
    print("\n".join(plan.lines()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(plan.to_dict(), f, indent=1)
    return 0


def cmd_ablate(args) -> int:
    """`t2t ablate configs/ablations/t5_table2.gin --scale=tiny`: run (or resume) every
    cell of the grid, then render its table and plot into --docs_dir."""
    from t2t.ablations import grid as grid_lib, report, runner
    grid = grid_lib.load_grid(args.grid, args.scale, args.gin + args.gin_bindings)
    cells = grid.select(args.cells.split(",") if args.cells else ())
    seeds = args.seeds if args.seeds is not None else list(grid.scale.seeds)
    if args.plan:
        return _plan_ablation(args, grid, cells, seeds)
    if args.list:
        results = runner.load_results(grid, args.out_dir)
        t2t_log = logging.getLogger("t2t")
        level = t2t_log.level
        t2t_log.setLevel(logging.WARNING)       # each stage's config logs its vocabulary size
        try:
            plans = runner.plan_grid(grid, cells, seeds, args.out_dir)
        finally:
            t2t_log.setLevel(level)
        print(report.status(grid, results, cells, seeds, plans,
                            runner.stage_cpu_seconds(args.out_dir, grid)))
        return 0
    report.check_plotting()
    if not args.render_only:
        ran = runner.run_grid(grid, args.out_dir, cells, seeds, args.shard)
        if ran and ran[-1].get("stopped_by") == "preempted":
            return EXIT_PREEMPTED
    command = " ".join([f"t2t ablate {args.grid} --scale={args.scale}"]
                       + [f"--out_dir={args.out_dir}"] * (args.out_dir != ABLATION_OUT_DIR)
                       + [shlex.quote(f"--gin={b}") for b in args.gin + args.gin_bindings])
    md, png = report.render(grid, runner.load_results(grid, args.out_dir), args.docs_dir,
                            command)
    print(f"wrote {md} and {png}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t2t", description=__doc__,
        epilog="--verbose (anywhere): tracebacks and debug logs. Exit codes: 0 done, 1 "
               "internal error, 2 bad input, 74 disk full during a checkpoint save, 75 preempted "
               "(SIGTERM or Ctrl-C; saved, rerun to resume), 130 aborted.")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_gin(p, required=True):
        p.add_argument("--gin_file", action="append", required=required,
                       help="gin file (path, or relative to configs/); repeatable" +
                       ("" if required else "; default: MODEL_DIR/config.gin, the run's own"))
        p.add_argument("--gin", action="append", default=[], metavar="BINDING",
                       help="a gin binding such as TransformerConfig.d_model=64; repeatable")
        return p

    p = with_gin(sub.add_parser("params", help="parameter counts of model configs"))
    p.set_defaults(func=cmd_params)
    p = with_gin(sub.add_parser("forward", help="one forward pass of model configs"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=16)
    p.set_defaults(func=cmd_forward)
    p = with_gin(sub.add_parser("train", help="pretrain or fine-tune from gin configs"),
                 required=False)
    p.add_argument("--coordinator_address", help="multi-process: host:port of process 0")
    p.add_argument("--num_processes", type=int)
    p.add_argument("--process_id", type=int)
    p.set_defaults(func=cmd_train)
    p = with_gin(sub.add_parser("finetune", help="fine-tune from a t2t or Hugging Face "
                                "checkpoint, then evaluate"),
                 required=False)
    p.add_argument("--split", action="append", default=[],
                   help="split to score after training (repeatable; default: the gin's)")
    p.add_argument("--coordinator_address", help="multi-process: host:port of process 0")
    p.add_argument("--num_processes", type=int)
    p.add_argument("--process_id", type=int)
    p.set_defaults(func=cmd_finetune)
    p = with_gin(sub.add_parser("eval", help="score MODEL_DIR's latest checkpoint"),
                 required=False)
    p.add_argument("--split", action="append", default=[],
                   help="split to score (repeatable; default: validation and test)")
    p.add_argument("--output_dir", help="where metrics.json and results.md go (MODEL_DIR)")
    p.set_defaults(func=cmd_eval)
    p = with_gin(sub.add_parser("infer", help="decode input lines with MODEL_DIR's model"),
                 required=False)
    p.add_argument("--input", help="file of inputs, one per line (default: stdin)")
    p.add_argument("--output", help="file for the outputs (default: stdout)")
    p.add_argument("--strategy", choices=("greedy", "beam"), default="greedy")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument("--alpha", type=float, default=0.6, help="beam length penalty")
    p.add_argument("--finish_in_beam", action="store_true",
                   help="beam: a hypothesis ends only from the top beam_size expansions "
                        "(fairseq's and transformers' rule; default T5X's: any of 2 x beam)")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--max_decode_length", type=int,
                   help="default: the target feature length")
    p.add_argument("--raw", action="store_true",
                   help="lines are model inputs as they are (no task prefix added)")
    p.set_defaults(func=cmd_infer)
    p = sub.add_parser("ablate", help="run a paper's ablation table (configs/ablations)")
    p.add_argument("grid", help="grid gin file, e.g. configs/ablations/t5_table2.gin")
    p.add_argument("--scale", default="tiny",
                   help="tiny | micro | gpu_micro | small | paper (the grid's scales; "
                        "gpu_micro in t5_table2.gin only; micro_learning_curve.gin has "
                        "micro only)")
    p.add_argument("--cells", help="comma-separated regexes of cell keys or labels (default: all)")
    p.add_argument("--seeds", type=_seed_list,
                   help="comma-separated seeds such as 0,1,2 (default: the scale's)")
    p.add_argument("--shard", help="i/n: run every n-th (cell, seed) from i (parallel hosts)")
    p.add_argument("--out_dir", default=ABLATION_OUT_DIR, help="where cells run and are cached")
    p.add_argument("--docs_dir", default="docs/ablations", help="where the table and plot go")
    p.add_argument("--gin", action="append", default=[], metavar="BINDING",
                   help="extra binding for the grid file; repeatable")
    p.add_argument("--list", action="store_true",
                   help="list the cells, their finished seeds, the seeds still to train "
                        "(with those that finished under an earlier configuration of the "
                        "scale) and those that would copy another grid's finished stages, "
                        "and exit")
    p.add_argument("--render_only", action="store_true", help="render what has finished")
    p.add_argument("--plan", action="store_true",
                   help="compile each distinct stage's step for --hardware's TPU slice (no "
                        "TPU needed) and print each cell's fit, step time, steps and "
                        "chip-hours, and the table's total; nothing trains")
    p.add_argument("--hardware", help="with --plan: a configs/hardware name such as "
                   "tpu_v5e_256 (default: the scale's own)")
    p.add_argument("--plan_cache", help="with --plan: JSON of compiled steps, reused by "
                   "later plans (default: OUT_DIR/plan_cache.json)")
    p.add_argument("--json", metavar="FILE", help="with --plan: also write the plan as JSON")
    p.set_defaults(func=cmd_ablate)
    p = with_gin(sub.add_parser("compile", help="compile a step for a TPU slice (no TPU "
                                "needed): per-chip memory, FLOPs, fits or not"))
    p.add_argument("--topology", help="TPU slice: v4-8, v5e-256, v5p-128, v6e-64, ... or "
                   "v5e:16x16 (default: the hardware config's TPU_TOPOLOGY)")
    p.add_argument("--num_slices", type=int,
                   help="slices joined over DCN (default: TPU_NUM_SLICES, else 1)")
    p.add_argument("--step", choices=("train", "finetune", "decode"), default="train",
                   help="decode: greedy decoding with the KV cache (t5, gpt), as t2t infer")
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("convert", help="Hugging Face directory or t2t MODEL_DIR -> Hugging "
                       "Face directory (load_pretrained / save_pretrained)")
    p.add_argument("src", help="a Hugging Face model directory or a t2t MODEL_DIR")
    p.add_argument("out", help="where the Hugging Face directory (or directories) go")
    p.add_argument("--model_type", help="for a MODEL_DIR: bert, roberta, albert, electra, "
                   "distilbert, gpt2 or t5")
    p.add_argument("--step", type=int, help="for a MODEL_DIR: checkpoint step (latest)")
    p.add_argument("--long", type=int, metavar="N", help="a RoBERTa written as a Longformer "
                   "of N positions (its learned positions copied over and over, global "
                   "projections copied from the local ones), e.g. --long 4096")
    p.add_argument("--window", type=int, default=512,
                   help="with --long: the Longformer's attention window (default 512)")
    p.set_defaults(func=cmd_convert)
    p = sub.add_parser("mlm_eval", help="held-out MLM loss (and, with --finetune, "
                       "downstream accuracy) of encoder pretraining runs, on equal terms")
    p.add_argument("model_dirs", nargs="+", help="t2t encoder pretraining MODEL_DIRs")
    p.add_argument("--task", default="bible_web_roberta_validation",
                   help="held-out MLM task; its masking is fixed, the same for every run")
    p.add_argument("--batches", type=int, default=20, help="batches of 32 x 128 to score")
    p.add_argument("--finetune", action="store_true", help="also fine-tune each encoder "
                   "briefly on bbc_topic (t2t data build bbc) and report its accuracy")
    p.add_argument("--finetune_steps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0, help="the fine-tuning's seed")
    p.add_argument("--json", metavar="FILE", help="also write {model_dir: metrics} as JSON")
    p.set_defaults(func=cmd_mlm_eval)
    sub.add_parser("data", help="build and list the offline datasets (t2t data --help); "
                   "bundle the micro scale's (t2t data bundle --help)")
    sub.add_parser("launch", help="run a command on Cloud TPU slices (t2t launch --help)")
    return parser


def configure_logging(verbose: bool = False) -> None:
    """t2t's progress lines ("compiling the train step", "resumed from step N") to stderr as
    plain lines; library chatter at WARNING (DEBUG everything with --verbose); orbax's
    "Metadata file does not exist" warning on every restore, which is expected, silenced, and
    without --verbose its tracebacks of failed background writes (the error is reported)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    t2t_log = logging.getLogger("t2t")
    t2t_log.handlers[:] = [handler]
    t2t_log.setLevel(logging.DEBUG if verbose else logging.INFO)
    t2t_log.propagate = False
    absl_log = logging.getLogger("absl")
    absl_log.addFilter(lambda record: "Metadata file does not exist" not in record.getMessage())
    for name in ("absl", "asyncio"):     # asyncio: "exception was never retrieved"
        if verbose:
            logging.getLogger(name).removeFilter(_quiet_orbax_failures)
        else:
            logging.getLogger(name).addFilter(_quiet_orbax_failures)


def _quiet_closed_event_loops() -> None:
    """Drops the "Event loop is closed" RuntimeErrors that tensorstore's write callbacks raise
    into an event loop orbax has closed after a failed background write (a full disk): they
    come after the failure, which t2t reports in one line. Any other unraisable exception
    goes to the hook there was."""
    previous = sys.unraisablehook
    if getattr(previous, "t2t_quiet", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    hook.t2t_quiet = True
    sys.unraisablehook = hook


def _quiet_orbax_failures(record: logging.LogRecord) -> bool:
    """Drops log records whose traceback runs through orbax: orbax logs each failed
    background write of a checkpoint (a full disk, say) with its traceback, asyncio the
    write futures nobody read, and the error is raised where the run waits for the save:
    t2t reports it there in one line (--verbose keeps them)."""
    if not record.exc_info or record.exc_info[2] is None:
        return True
    where = f"{os.sep}orbax{os.sep}"
    return not any(where in frame.filename for frame in traceback.extract_tb(record.exc_info[2]))


def _report_error(command: str, error: BaseException, summary: str) -> None:
    """One line on stderr; the traceback (and the error's details) into ERROR_LOG."""
    try:
        with open(ERROR_LOG, "w", encoding="utf-8") as f:
            f.write(f"t2t {command}\n")
            traceback.print_exception(error, file=f)
        where = f" (details: {ERROR_LOG}, or rerun with --verbose)"
    except OSError:
        where = " (rerun with --verbose for the traceback)"
    print(f"t2t {command}: error: {summary}{where}", file=sys.stderr)


def _internal_error(command: str, error: BaseException) -> int:
    """Any other exception: `internal error: TYPE: message` in one line, traceback in the log."""
    message = str(error).strip().splitlines()
    summary = f"internal error: {type(error).__name__}" + (f": {message[0]}" if message else "")
    _report_error(command, error, summary)
    return EXIT_INTERNAL


def _own_parser(command: str, verbose: bool, run, argv: List[str]) -> int:
    """`run(argv)` of a subcommand with its own argparse (`launch`, `data`), which reports its
    own errors in one line: anything else is one internal-error line (--verbose raises)."""
    try:
        return run(argv)
    except Exception as e:
        if verbose:
            raise
        return _internal_error(command, e)


def main(argv: Optional[List[str]] = None) -> int:
    """Exit codes: 0 done, 1 internal error (one line on stderr, the traceback in ERROR_LOG),
    2 bad input (one line on stderr), 74 the disk filled up during a checkpoint save (one
    line), 75 stopped by SIGTERM/Ctrl-C after saving a checkpoint (run the same command again
    to resume), 130 aborted by a second Ctrl-C. --verbose raises instead of printing one
    line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:   # its own argparse; the command after `--` passes untouched
        from t2t.launch import cli as launch_cli
        split = argv.index("--") if "--" in argv else len(argv)
        own, command = argv[1:split], argv[split:]
        return _own_parser("launch", "--verbose" in own,   # LaunchError: its own line
                           launch_cli.main, [a for a in own if a != "--verbose"] + command)
    verbose = "--verbose" in argv
    argv = [a for a in argv if a != "--verbose"]
    configure_logging(verbose)
    if not verbose:
        _quiet_closed_event_loops()
    if argv[:1] != ["compile"]:   # compile targets TPU topologies through libtpu itself
        from t2t import platforms
        platforms.set_default_platforms()
    if argv[:2] == ["data", "bundle"]:  # the micro scale's data in one directory that travels
        from t2t.data import bundle
        return _own_parser("data", verbose, bundle.main, argv[2:])   # its errors: one line
    if argv[:1] == ["data"]:  # its own argparse, --help included
        from t2t.data.catalog import builders
        return _own_parser("data", verbose, builders.main, argv[1:])   # BuildError: its own
    bindings, rest = _gin_args(argv)
    args = build_parser().parse_args(rest)
    args.gin_bindings = bindings
    args.argv = argv
    try:
        if args.command != "compile":   # AOT executables for compile-only devices: not cached
            platforms.enable_compilation_cache()
        return args.func(args)
    except KeyboardInterrupt:
        if verbose:
            raise
        print(f"t2t {args.command}: aborted", file=sys.stderr)
        return 130
    except DiskFullError as e:
        if verbose:
            raise
        _report_error(args.command, e, e.summary)
        return EXIT_DISK_FULL
    except (UserError, FileNotFoundError) as e:
        if verbose:
            raise
        _report_error(args.command, e, getattr(e, "summary", None) or str(e).splitlines()[0])
        return EXIT_USAGE
    except (ValueError, RuntimeError, TypeError) as e:   # gin's own errors, in one line
        from t2t.run import gin_utils
        summary = gin_utils.error_summary(e)
        if verbose:
            raise
        if summary is None:
            return _internal_error(args.command, e)
        _report_error(args.command, e, summary)
        return EXIT_USAGE
    except Exception as e:      # a bug (t2t's or a library's): one line, traceback in the log
        if verbose:
            raise
        return _internal_error(args.command, e)


if __name__ == "__main__":
    sys.exit(main())
