"""`mgpu-launch drill`: will my script survive a failure? Find out before the real run.

    mgpu-launch drill [OPTIONS] CLUSTER.yaml SCRIPT [ARGS...]
    mgpu-launch drill [OPTIONS] --local N SCRIPT [ARGS...]
    mgpu-launch drill [OPTIONS] --slurm SCRIPT [ARGS...]

Runs the job as a launch does (launcher/job/run/launch.py), listens to its typed
events and, once it has saved a checkpoint, injects faults one after another
(launcher/commands/drill_faults.py): a worker killed, a preemption (SIGTERM with
the configured grace), a hang (SIGSTOP) and, on SSH hosts, a whole host lost.
Each is judged (launcher/views/drill_report.py); RUN_DIR/drill.json gets the
verdicts, the checkpoint cost and the recommended interval; a table goes to
stdout. A job that finishes before every fault was injected, or finishes its
training during one, is started again (RUN_DIR/job2, ...) for the rest.

Exit codes: 0 every fault passed, 1 one failed, 2 usage (or a host that
cannot be reached), 128 + signal when interrupted. docs/drill.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import threading
import time
from pathlib import Path

from ..job.run.launch import Job, LaunchRefused
from ..job.run.sequence import EarlyEnd, StopRequest, run_launch
from ..outlets.printer import Printer
from ..spec.allocation import AllocationError, system_of
from ..spec.config import ConfigError, LoadedConfig
from ..spec.plan import PlanError
from ..spec.transports import traits
from ..transport.factory import make_transport, quiet_paramiko_logs
from ..views.drill_report import (
    DEFAULT_MTBF_HOURS,
    FAULTS,
    OPT_IN,
    Observed,
    judge,
    render,
    report,
)
from . import control, exits, loading, usage
from .drill_faults import Heard, Injector
from .drill_memory import MemoryCosts
from .foreground import prepare_launch
from .signals import stops_asked
from .usage import say

DRILL_JSON = "drill.json"
MAX_JOBS = 4


class Usage(Exception):
    """A usage error: said, exit 2."""


def _parser() -> argparse.ArgumentParser:
    parser = usage.Parser(
        prog="mgpu-launch drill",
        usage="mgpu-launch drill [OPTIONS] (CLUSTER.yaml | --local N | --slurm) SCRIPT [ARGS...]",
        description="Run SCRIPT as a job, inject faults once it has saved a checkpoint "
        "and say whether it resumed from its last checkpoint each time (docs/drill.md).")
    parser.add_argument("--local", type=int, metavar="N", help="N simulated hosts here")
    loading.add_allocation_options(parser, lambda s: f"the nodes of this {s.title} allocation")
    parser.add_argument("--faults", default=None, metavar="LIST",
                        help="comma-separated, of kill, preempt, hang, host, nan (default: "
                        "those that apply: host on SSH hosts only; nan with --nan)")
    parser.add_argument("--nan", action="store_true",
                        help="also make one worker's weights NaN at a step: the NaN sentinel "
                        "must see it, roll back to the save before it and replay past it")
    parser.add_argument("--run-dir", help="run directory (default runs/<name>-drill-<timestamp>)")
    parser.add_argument("--mtbf-hours", type=float, default=DEFAULT_MTBF_HOURS, metavar="H",
                        help="mean time between failures of one host, in hours, for the "
                        "recommended checkpoint interval (default %(default)g)")
    parser.add_argument("--checkpoint-wait", type=float, default=300.0, metavar="S",
                        help="how long to wait for the first checkpoint before injecting "
                        "anyway (default %(default)g s)")
    parser.add_argument("--memory", action="store_true",
                        help="turn on checkpoint.memory for the drill's job: measures a "
                        "save to host memory against the directory and advises "
                        "checkpoint.memory_interval")
    parser.add_argument("-q", "--quiet", action="store_true", help="no task output")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    rest = args.rest
    if rest and rest[0].lower().endswith((".yaml", ".yml")):  # options may follow it too
        args.rest = [rest[0], *parser.parse_args(rest[1:], namespace=args).rest]
    try:
        loaded, command, faults = _load(args)
        run_dir = _run_dir(args, loaded)
    except Usage as exc:
        say(f"mgpu-launch drill: {exc}")
        return exits.USAGE
    except (ConfigError, AllocationError) as exc:
        say(f"mgpu-launch: {exc}")
        return exits.USAGE
    return _drill(args, loaded, command, faults, run_dir)


def _load(args: argparse.Namespace) -> tuple[LoadedConfig, list[str], list[str]]:
    if args.mtbf_hours <= 0:
        raise Usage("--mtbf-hours needs a number of hours > 0")
    if args.checkpoint_wait <= 0:
        raise Usage("--checkpoint-wait needs a number of seconds > 0")
    try:
        loaded, command = loading.cluster_and_script(
            args.rest, args.local, args.allocation,
            expected="expected a cluster YAML and a training script (or --local N, --slurm)")
    except loading.ArgumentError as exc:
        raise Usage(str(exc)) from None
    if args.memory:  # the memory tier's cost measured (commands/drill_memory.py)
        settings = loaded.config.checkpoint.model_copy(update={"memory": True})
        loaded = dataclasses.replace(
            loaded, config=loaded.config.model_copy(update={"checkpoint": settings}))
    faults = _faults(args.faults, loaded.config.transport)
    if (args.nan or "nan" in faults) and loaded.config.sentinel == "off":
        raise Usage("--nan: the cluster file turns the NaN sentinel off (`sentinel: off`): "
                    "nothing would watch the loss; remove it for the drill")
    return loaded, command, faults + (["nan"] if args.nan and "nan" not in faults else [])


def _faults(given: str | None, name: str) -> list[str]:
    transport = traits(name)
    if given is None:
        return [f for f in FAULTS if f not in OPT_IN and (f != "host" or transport.ssh)]
    faults = [f.strip() for f in given.split(",") if f.strip()]
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        raise Usage(f"--faults: unknown fault {', '.join(unknown) or '(none given)'}: "
                    f"choose from {','.join(FAULTS)}")
    if "host" in faults and transport.allocation:
        raise Usage("--faults host: a lost host is drilled on SSH or simulated hosts, not "
                    f"inside a {system_of(name).title} allocation")
    return list(dict.fromkeys(faults))


def _run_dir(args: argparse.Namespace, loaded: LoadedConfig) -> Path:
    name = f"{loaded.config.name}-drill-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir = (Path(args.run_dir) if args.run_dir else Path("runs") / name).resolve()
    if not control.run_dir_free(run_dir):
        raise Usage(f"run directory {run_dir} is not empty: give a new --run-dir")
    return run_dir


def _drill(args: argparse.Namespace, loaded: LoadedConfig, command: list[str],
           faults: list[str], run_dir: Path) -> int:
    observed: list[Observed] = []
    series: list = []
    timed: list[float] = []  # each save's seconds, as the bootstrap timed them
    save_steps: list[int] = []
    stop = StopRequest()
    copies = MemoryCosts()  # the memory tier's background copies, every job's
    left = faults
    for number in range(1, MAX_JOBS + 1):
        where = run_dir if number == 1 else run_dir / f"job{number}"
        try:
            injector, heard = _one_job(args, loaded, command, left, where, number, stop,
                                       copies)
        except Usage as exc:
            if number == 1:
                say(f"mgpu-launch drill: {exc}")
                return exits.USAGE
            observed += [Observed(f, not_injected=f"the drill's job {number}, for the {f}, "
                                  f"could not start: {exc}") for f in left]
            break
        series += heard.history.series(injector.fault_t)
        timed += heard.history.save_seconds
        save_steps += [step for _, step, _ in heard.saves()]
        again = [o.fault for o in injector.observed if o.again]
        retry = injector.injected > 0 and not stop.signals and number < MAX_JOBS
        observed += [o for o in injector.observed if not (o.again and retry)]
        left = again if retry else []
        if not left:
            break
    hosts = sum(1 for h in loaded.config.hosts if not h.spare)
    data = report([judge(o) for o in observed], series, hosts, args.mtbf_hours, timed,
                  save_steps, copies.figures())
    data["run_dir"] = str(run_dir)
    fd = os.open(run_dir / DRILL_JSON, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:  # user-readable only, as the run directory
        handle.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    print(render(data), flush=True)
    print(f"drill: {run_dir / DRILL_JSON}", flush=True)
    if stop.first is not None:
        return exits.by_signal(stop.first)
    return exits.PASSED if data["passed"] and observed else exits.FAILED


def _one_job(args: argparse.Namespace, loaded: LoadedConfig, command: list[str],
             faults: list[str], run_dir: Path, number: int,
             stop: StopRequest, copies: MemoryCosts) -> tuple[Injector, Heard]:
    """One job of the drill, with `faults` injected into it; raises Usage when
    it cannot start (exit 2)."""
    config = loaded.config
    try:
        # The first job claims the checkpoint directory; the claim lasts as long as this process.
        launch, first = prepare_launch(loaded, command, run_dir, claim=number == 1,
                                       check_python=number == 1)
    except (LaunchRefused, PlanError) as exc:
        raise Usage(str(exc)) from None
    if traits(config.transport).ssh:
        quiet_paramiko_logs()
    printer = Printer([t.label for t in first.tasks], quiet=args.quiet, live=False)
    heard = Heard()
    thread: threading.Thread | None = None

    def started(job: Job) -> None:
        nonlocal thread, injector
        printer.notice(f"drill: run dir {run_dir}; faults {', '.join(faults)}, each once "
                       "the job has saved a checkpoint")
        plan = job.connected.plan
        injector = Injector(job, heard, faults, grace_s=plan.grace_s,
                            checkpoint_wait_s=args.checkpoint_wait,
                            checkpoint_dir=plan.checkpoint_dir, say=printer.notice)
        thread = threading.Thread(target=injector.run, name="drill", daemon=True)
        thread.start()

    injector: Injector | None = None
    with stops_asked(stop):
        ended = run_launch(launch, first, make_transport(config), printer, stop,
                           views=[heard, copies], started=started)
    if isinstance(ended, EarlyEnd):
        printer.finish()
        if ended.why == "interrupted":  # as Ctrl-C before the drill's job
            raise KeyboardInterrupt(ended.signum)
        raise Usage("; ".join(ended.reasons))
    assert thread is not None and injector is not None
    thread.join(timeout=30)
    printer.finish()
    return injector, heard
