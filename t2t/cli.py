"""The `t2t` command line: one entry point, one subcommand per job."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional


def _model_from_gin(gin_files: List[str], bindings: List[str]):
    from t2t import gin_utils
    from t2t.nn.config import TransformerConfig
    gin_utils.parse(gin_files, bindings)
    family = gin_utils.query_macro("MODEL_FAMILY")
    if family is None:
        raise SystemExit(f"{gin_files}: no MODEL_FAMILY macro; include a configs/models/* file")
    return family, TransformerConfig()


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
    from t2t import gin_utils
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
    from t2t import gin_utils
    from t2t.train import distributed, experiment
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    gin_utils.parse(args.gin_file, args.gin + args.gin_bindings)
    experiment.run()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2t", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def with_gin(p):
        p.add_argument("--gin_file", action="append", required=True,
                       help="gin file (path, or relative to configs/); repeatable")
        p.add_argument("--gin", action="append", default=[], metavar="BINDING",
                       help="a gin binding such as TransformerConfig.d_model=64; repeatable")
        return p

    p = with_gin(sub.add_parser("params", help="parameter counts of model configs"))
    p.set_defaults(func=cmd_params)
    p = with_gin(sub.add_parser("forward", help="one forward pass of model configs"))
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--length", type=int, default=16)
    p.set_defaults(func=cmd_forward)
    p = with_gin(sub.add_parser("train", help="pretrain or fine-tune from gin configs"))
    p.add_argument("--coordinator_address", help="multi-process: host:port of process 0")
    p.add_argument("--num_processes", type=int)
    p.add_argument("--process_id", type=int)
    p.set_defaults(func=cmd_train)
    sub.add_parser("data", help="build and list the offline datasets (t2t data --help)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["data"]:  # its own argparse, --help included
        from t2t.data import builders
        return builders.main(argv[1:])
    bindings, rest = _gin_args(argv)
    args = build_parser().parse_args(rest)
    args.gin_bindings = bindings
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
