"""The run command: `mgpu-launch [OPTIONS] CLUSTER.yaml SCRIPT [ARGS...]`
(`--local N`, `--slurm`, `--dry-run`, `--detach`), from its argv to its exit code.

Parses the arguments, reads the cluster file and checks the run directory;
then hands the run to launcher/commands/foreground.py, imported only after
that (the job's modules: the launch, its events and states, the printer).
Usage, cluster file and plan errors are said here, with exit 2; the job's
outcome and the signals while it runs are foreground.py's. launcher/cli.py
dispatches to it (and to the other commands).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from ..spec.addresses import AddressError
from ..spec.allocation import AllocationError
from ..spec.config import ConfigError, LoadedConfig
from ..spec.plan import PlanError
from ..spec.rundir import why_unwritable
from . import control, exits, loading, usage
from .usage import say

USAGE = """\
mgpu-launch [OPTIONS] CLUSTER.yaml SCRIPT [ARGS...]   run SCRIPT on every task of the cluster
mgpu-launch [OPTIONS] --local N SCRIPT [ARGS...]      run N simulated hosts on this machine
mgpu-launch [OPTIONS] --slurm SCRIPT [ARGS...]        run on the nodes of this Slurm allocation
mgpu-launch --detach [OPTIONS] CLUSTER.yaml SCRIPT    the same in the background: print the
                                                      run dir and return
mgpu-launch --dry-run [--json] [--task H/T] CLUSTER.yaml SCRIPT  print the plan"""

EPILOG = """\
other commands:
  mgpu-launch check CLUSTER.yaml               check the cluster before a run
  mgpu-launch status RUN_DIR [--json|--watch]  state of a run (finished or still going);
                                               --watch: its live table until it ends
  mgpu-launch logs RUN_DIR [TASK] [-f] [-n N]  a task's log; -f follows a running job
  mgpu-launch stop RUN_DIR [--timeout S]       stop a running job gracefully (SIGTERM to its
                                               launcher) and wait for its summary
  mgpu-launch report RUN_DIR [-o FILE]         the run as one HTML file (opens offline)
  mgpu-launch profile RUN_DIR [--seconds S]    trace every task of a running job at once:
                                               step time, collectives, input, compute
                                               (--allow-restart: MWMS, which TF may crash)
  mgpu-launch export --to slurm|trainjob|tfjob CLUSTER.yaml SCRIPT [ARGS...]
  mgpu-launch simulate N [--dir DIR] [--detach] | simulate stop --dir DIR
  mgpu-launch drill CLUSTER.yaml|--local N SCRIPT  inject faults: does the script resume?

The launcher keeps the job running when its terminal goes away (SIGHUP, a closed
pipe such as `| head`); everything is in the run directory."""


class UsageError(Exception):
    pass


def main(argv: Sequence[str]) -> int:
    """The run command's exit code (the job's, or 2 for a usage, cluster file or plan error)."""
    try:
        return _run(list(argv))
    except UsageError as exc:
        say(f"mgpu-launch: {exc}\nusage:\n{USAGE}")
        return exits.USAGE
    except ConfigError as exc:
        say(f"mgpu-launch: {exc}")
        return exits.USAGE
    except PlanError as exc:
        say(f"mgpu-launch: cannot plan the job: {exc}")
        return exits.USAGE
    except AddressError as exc:
        say(f"mgpu-launch: {exc}")
        return exits.USAGE


def _run_parser() -> argparse.ArgumentParser:
    parser = usage.Parser(
        prog="mgpu-launch", usage=USAGE,
        description="Run a TensorFlow/Keras training script on many hosts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mgpu-launch {__version__}")
    parser.add_argument("--local", type=int, metavar="N",
                        help="run N simulated hosts on this machine (no YAML needed)")
    loading.add_allocation_options(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="print every task's host, role, ports, env and TF_CONFIG; "
                        "start nothing")
    parser.add_argument("--json", action="store_true", help="with --dry-run: print JSON")
    parser.add_argument("--task", metavar="HOST/ROLEINDEX",
                        help="with --dry-run: print only this task, whole (its full "
                        "TF_CONFIG and environment), e.g. host0/worker0")
    parser.add_argument("--run-dir", help="run directory (default runs/<name>-<timestamp>)")
    parser.add_argument("--max-restarts", type=int, metavar="N",
                        help="override restart.max_restarts of the YAML")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="do not stream task output (it still goes to the log files); "
                        "launcher notices, the live table and the summary remain")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also print task state changes and, when not on a terminal, "
                        "every task's status (step, loss, CPU, memory) every 10 s")
    parser.add_argument("--no-live", dest="live", action="store_false",
                        help="no live status table on a terminal: plain prefixed lines only")
    parser.add_argument("--detach", action="store_true",
                        help="run in the background (own session, output to "
                        "RUN_DIR/launcher.out); print the run dir and return")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus metrics on this port while the job runs "
                        "(127.0.0.1 unless metrics.host says otherwise; 0: any free port)")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _load(args: argparse.Namespace) -> tuple[LoadedConfig, list[str]]:
    option = f"--{args.allocation}" if args.allocation else f"--local {args.local}"
    try:
        return loading.cluster_and_script(
            args.rest, args.local, args.allocation,
            check_script=lambda script: _no_cluster_file(script, option))
    except loading.ArgumentError as exc:
        raise UsageError(str(exc)) from None
    except AllocationError as exc:
        raise UsageError(str(exc)) from None


def _no_cluster_file(script: str, option: str) -> None:
    """`--local 2 cluster.yaml train.py` would run the YAML as the script."""
    if script.lower().endswith((".yaml", ".yml")):
        raise UsageError(f"{option} makes the cluster itself, so {script} would be run as "
                         f"the training script: give either {option} or a cluster file, not "
                         f"both (`mgpu-launch {option} train.py` or `mgpu-launch {script} "
                         "train.py`)")


def _default_run_dir(loaded: LoadedConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{loaded.config.name}-{stamp}-{os.getpid()}"


def _options_first(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`CLUSTER.yaml --no-live SCRIPT ARGS` as `--no-live CLUSTER.yaml SCRIPT ARGS`:
    the launcher's options between the cluster file and the script are its own
    (argparse would run the first as the script); whatever follows the script
    is the script's. With an option the launcher does not know there, argv as
    given (loading refuses a script that starts with `-`)."""
    args = parser.parse_args(argv)
    rest = args.rest
    if args.local is not None or args.allocation or len(rest) < 2 or rest[0] == "--" \
            or not rest[1].startswith("-"):
        return argv
    head, cluster, tail = argv[:len(argv) - len(rest)], rest[0], rest[1:]
    if tail[0] == "--":  # `CLUSTER.yaml -- SCRIPT`: what follows is the script
        return [*head, cluster, *tail[1:]]
    known, unknown = parser.parse_known_args(tail)
    if unknown:
        return argv
    return [*head, *tail[:len(tail) - len(known.rest)], cluster, *known.rest]


def _run(argv: list[str]) -> int:
    parser = _run_parser()
    argv = _options_first(parser, argv)
    args = parser.parse_args(argv)
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run")
    if args.task and not args.dry_run:
        raise UsageError("--task goes with --dry-run")
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UsageError("--max-restarts needs a number >= 0")
    loaded, command = _load(args)
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(loaded)
    run_dir = run_dir.resolve()
    unwritable = None if args.dry_run else why_unwritable(run_dir)
    if unwritable is not None:  # before any host is reached: one line, nothing made
        say(f"mgpu-launch: cannot write the run directory {run_dir}: {unwritable}; "
            "choose another --run-dir")
        return exits.USAGE
    if not args.dry_run and not control.run_dir_free(run_dir):
        raise UsageError(f"run directory {run_dir} is not empty: give a new --run-dir "
                         "(each run keeps its own logs, events and summary)")
    from . import foreground as run  # the job's modules

    if args.dry_run:
        from ..spec.planview import NoSuchTask

        try:
            return run.dry_run(loaded, command, run_dir, args)
        except NoSuchTask as exc:
            raise UsageError(str(exc)) from None
    return run.run(loaded, command, run_dir, args, argv)
