"""`t2t launch tpu | status | logs | delete`: Cloud TPU jobs from the command line.

    t2t launch tpu --name NAME --zone ZONE --accelerator v5e-256 [--num_slices 2] [--spot]
        [--project P] [--env NAME=VALUE ...] [--dry-run] -- t2t train --gin_file=...
        --gin.MODEL_DIR=gs://bucket/run

Everything after `--` runs unchanged on every worker, from the unpacked checkout, with the
`--env` variables set (and this shell's LIBTPU_INIT_ARGS, if it has one).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys
from typing import Dict, List, Mapping, Optional, Sequence

from t2t.errors import EXIT_USAGE
from t2t.launch import remote, source
from t2t.launch.gcloud import LaunchError, Slice
from t2t.launch.tpu import DryRun, Launcher, Runner, Shell, check_env_name

LIBTPU_ARGS = "LIBTPU_INIT_ARGS"   # libtpu's flags; docs/tpu.md


def _where(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--name", required=True, help="queued resource (and node) name")
    p.add_argument("--zone", required=True, help="e.g. us-west4-a")
    p.add_argument("--project", help="Google Cloud project (default: gcloud's)")
    p.add_argument("--num_slices", type=int, default=1, help="slices joined over DCN")
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print every gcloud call, one shell-quoted line each; run nothing")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="t2t launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True)
    p = _where(sub.add_parser("tpu", help="create a slice, run a command on it to the end"))
    p.add_argument("--accelerator", required=True,
                   help="slice type: v4-8, v5e-256 (= v5litepod-256), v5p-128, v6e-64, ...")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
    kind.add_argument("--reserved", action="store_true", help="the project's reservation")
    p.add_argument("--runtime_version", help="TPU VM image (default: the family's)")
    p.add_argument("--source", type=pathlib.Path,
                   help="t2t checkout to install on the workers (default: this one)")
    p.add_argument("--poll_seconds", type=float, default=30.0,
                   help="seconds between state checks while waiting")
    p.add_argument("--max_restarts", type=int, default=100,
                   help="give up after this many preemptions")
    p.add_argument("--env", action="append", default=[], metavar="NAME[=VALUE]",
                   help="set NAME in the command's environment on every worker (repeatable); "
                   "NAME alone takes this shell's value. LIBTPU_INIT_ARGS, when set here, is "
                   "forwarded unless --env gives it (e.g. --xla_jf_conv_input_fusion=false, "
                   "libtpu 0.0.42.1's workaround; --env LIBTPU_INIT_ARGS= sends it empty)")
    _where(sub.add_parser("status", help="the queued resource and the command's state"))
    p = _where(sub.add_parser("logs", help="worker 0's log"))
    p.add_argument("--follow", action="store_true", help="follow it until the command ends")
    _where(sub.add_parser("delete", help="delete the queued resource and its slices"))
    return parser


def _slice(args) -> Slice:
    return Slice(name=args.name, zone=args.zone, project=args.project,
                 num_slices=args.num_slices, accelerator=getattr(args, "accelerator", "v5e-8"),
                 spot=getattr(args, "spot", False), reserved=getattr(args, "reserved", False),
                 runtime_version=getattr(args, "runtime_version", None))


def _warn_local_model_dir(command: List[str]) -> None:
    """A re-created slice starts with empty disks: a local MODEL_DIR cannot be resumed."""
    for arg in command:
        if arg.startswith("--gin.MODEL_DIR=") and "://" not in arg:
            print(f"t2t launch: warning: {arg} is on the worker's disk, which a preemption "
                  "loses; use a bucket (--gin.MODEL_DIR=gs://BUCKET/RUN) to resume",
                  file=sys.stderr)


def job_env(items: Sequence[str], local: Mapping[str, str]) -> Dict[str, str]:
    """`--env` items (`NAME=VALUE`, or `NAME` for `local`'s value) as a dict; `local`'s
    LIBTPU_INIT_ARGS is added, with one log line, when no item names it."""
    env: Dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        check_env_name(name, item)
        if not eq:
            if name not in local:
                raise LaunchError(f"--env {name}: not set in this shell; give its value "
                                  f"(--env {name}=VALUE) or export it")
            value = local[name]
        env[name] = value
    if LIBTPU_ARGS in local and LIBTPU_ARGS not in env:
        env[LIBTPU_ARGS] = local[LIBTPU_ARGS]
        print(f"t2t launch: forwarding {LIBTPU_ARGS}={shlex.quote(env[LIBTPU_ARGS])} from this "
              f"shell to every worker (--env {LIBTPU_ARGS}=... overrides it)", file=sys.stderr)
    return env


def run(args, command: List[str], runner: Runner) -> int:
    slice_ = _slice(args)
    node0 = slice_.nodes[0]
    if args.action == "tpu":
        _warn_local_model_dir(command)
        env = job_env(args.env, os.environ)
        checkout = args.source or source.default_checkout()
        return Launcher(slice_, command, runner, checkout=checkout, env=env,
                        poll_seconds=args.poll_seconds, max_restarts=args.max_restarts).run()
    if args.action == "status":
        code = runner.call(slice_.describe())
        status = runner.output(slice_.ssh(node0, remote.exit_code(), worker="0"))
        if not args.dry_run:
            print(f"command on {node0} worker 0: "
                  f"{status if status is not None else 'unreachable'}")
        return code
    if args.action == "logs":
        script = remote.follow() if args.follow else remote.show_log()
        return runner.call(slice_.ssh(node0, script, worker="0"))
    return runner.call(slice_.delete())


def main(argv: Optional[List[str]] = None) -> int:
    """`t2t launch ...`; the command to run follows `--` and is passed on untouched."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command: List[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    if command and args.action != "tpu":
        print(f"t2t launch {args.action}: error: takes no command after --", file=sys.stderr)
        return EXIT_USAGE
    runner = DryRun() if args.dry_run else Shell()
    try:
        return run(args, command, runner)
    except LaunchError as e:
        print(f"t2t launch {args.action}: error: {e.summary}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"t2t launch {args.action}: stopped watching; the job keeps running on the "
              f"slice (t2t launch logs / status / delete --name {args.name} --zone "
              f"{args.zone})", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
