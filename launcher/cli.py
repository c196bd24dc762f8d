"""The command line: parse arguments, read files and environment, print, exit.

Owns every exit code and every top-level message. The only module that turns
outcomes (RunResult) and faults (ConfigError, TransportError, ...) into text
and exit codes:

    0 the job finished   1 the job failed   2 bad configuration or usage
    130 interrupted (SIGINT)   143 terminated (SIGTERM)

The terminal never decides the job's fate: SIGHUP and a closed stdout (EPIPE)
only make the printer stop writing; the job runs on, the run directory gets
everything and the exit code is the job's. `--detach` (launcher/commands/control.py)
runs the same command in the background.

The launch itself (hosts, agents, plan, supervisor, summary) is
launcher/job/launch.py's: this module parses arguments, calls it, prints what
comes back and owns the signals while it runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .commands import control, exits, loading, prereqs, usage
from .commands.signals import stops_asked
from .commands.usage import say, shown
from .job.classify import signal_name
from .job.launch import Launch, LaunchRefused, Outcome
from .job.sequence import EarlyEnd, run_launch
from .job.states import Failure, RunResult
from .spec import planview, rundir
from .spec.addresses import AddressError
from .spec.allocation import SlurmError
from .spec.config import ConfigError, LoadedConfig
from .spec.plan import Plan, PlanError
from .spec.transports import traits as transport_traits
from .transport.factory import make_transport, quiet_paramiko_logs
from .views import narrate, outlets
from .views.live import format_duration
from .views.printer import Printer

# Subcommand -> module with `main(argv) -> int`, imported only when used.
SUBCOMMANDS = {
    "check": "launcher.commands.check",    # check a cluster before a run
    "simulate": "launcher.commands.simulate",  # start simulated SSH hosts on loopback
    "status": "launcher.commands.status",  # read a run directory
    "logs": "launcher.commands.status",
    "export": "launcher.commands.export",  # Slurm / Kubernetes TFJob
    "stop": "launcher.commands.control",   # stop a running (e.g. detached) job
    "report": "launcher.commands.report",  # a run as one self-contained HTML file
    "profile": "launcher.commands.profile",  # trace every task of a running job at once
    "drill": "launcher.commands.drill",    # inject faults: will the script survive them?
}

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
  mgpu-launch export --to slurm|tfjob CLUSTER.yaml SCRIPT [ARGS...]
  mgpu-launch simulate N [--dir DIR] [--detach] | simulate stop --dir DIR
  mgpu-launch drill CLUSTER.yaml|--local N SCRIPT  inject faults: does the script resume?

The launcher keeps the job running when its terminal goes away (SIGHUP, a closed
pipe such as `| head`); everything is in the run directory."""


class UsageError(Exception):
    pass


def _run_parser() -> argparse.ArgumentParser:
    parser = usage.Parser(
        prog="mgpu-launch", usage=USAGE,
        description="Run a TensorFlow/Keras training script on many hosts.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"mgpu-launch {__version__}")
    parser.add_argument("--local", type=int, metavar="N",
                        help="run N simulated hosts on this machine (no YAML needed)")
    parser.add_argument("--slurm", action="store_true",
                        help="run on the nodes of the Slurm allocation this runs in "
                        "(salloc, sbatch), one worker per node (no YAML needed)")
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


def main(argv: Sequence[str] | None = None) -> int:
    control.take_detached_run_dir()  # before anything starts: tasks must not inherit it
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # e.g. `mgpu-launch --dry-run ... | head`: nothing left to say
        silence_fds(1)
        return exits.OK


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        try:
            module = importlib.import_module(SUBCOMMANDS[argv[0]])
        except ModuleNotFoundError as exc:
            say(f"mgpu-launch: `{argv[0]}` is not available in this build ({exc})")
            return exits.USAGE
        return module.main(argv)
    try:
        return _run(argv)
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
    except (LaunchRefused, outlets.OutletError) as exc:  # e.g. ports or checkpoint dir taken
        say(f"mgpu-launch: {exc}")
        return exits.USAGE


def _load(args: argparse.Namespace) -> tuple[LoadedConfig, list[str]]:
    option = "--slurm" if args.slurm else f"--local {args.local}"
    try:
        return loading.cluster_and_script(
            args.rest, args.local, args.slurm,
            check_script=lambda script: _no_cluster_file(script, option))
    except loading.ArgumentError as exc:
        raise UsageError(str(exc)) from None
    except SlurmError as exc:
        raise UsageError(str(exc)) from None


def _no_cluster_file(script: str, option: str) -> None:
    """`--local 2 cluster.yaml train.py` would run the YAML as the script."""
    if script.lower().endswith((".yaml", ".yml")):
        raise UsageError(f"{option} makes the cluster itself, so {script} would be run as "
                         f"the training script: give either {option} or a cluster file, not "
                         f"both (`mgpu-launch {option} train.py` or `mgpu-launch {script} "
                         "train.py`)")


def _default_run_dir(name: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{name}-{stamp}-{os.getpid()}"


def _run(argv: list[str]) -> int:
    args = _run_parser().parse_args(argv)
    if args.json and not args.dry_run:
        raise UsageError("--json goes with --dry-run")
    if args.task and not args.dry_run:
        raise UsageError("--task goes with --dry-run")
    loaded, command = _load(args)
    config = loaded.config
    local = transport_traits(config.transport).simulated
    run_dir = Path(args.run_dir) if args.run_dir else _default_run_dir(config.name)
    run_dir = run_dir.resolve()
    if not args.dry_run and not control.run_dir_free(run_dir):
        raise UsageError(f"run directory {run_dir} is not empty: give a new --run-dir "
                         "(each run keeps its own logs, events and summary)")
    # Every host's TF address as far as known before any agent answered (spares too).
    launch = Launch(loaded, command, run_dir, str(Path.cwd()))
    if args.dry_run:
        return _dry_run(launch.plan(0), args, config.ports.base == "auto")
    if local:  # simulated hosts run the tasks with this machine's Python
        missing = prereqs.local_problem(launch.pythons, Path(command[0]), config.strategy)
        if missing:
            say(f"mgpu-launch: {missing}")
            return exits.USAGE
    # A detached run claims the checkpoint directory in its own process.
    prepared = launch.prepare(claim=not args.detach)
    if prepared.moved is not None:
        say(f"mgpu-launch: {narrate.checkpoint_moved(prepared.moved)}")
    first_plan = prepared.plan
    if args.max_restarts is not None and args.max_restarts < 0:
        raise UsageError("--max-restarts needs a number >= 0")
    views = outlets.make_outlets(loaded, run_dir, args.metrics_port)  # a busy port: exit 2
    if args.detach:  # the background launcher makes its own
        views.close()
        return control.detach(argv, args.rest, run_dir, config.name, views.metrics_port,
                              views.said)
    return _launch(launch, first_plan, args, views)


def _dry_run(plan: Plan, args: argparse.Namespace, ports_auto: bool) -> int:
    if args.task:
        try:
            task = planview.find_task(plan, args.task)
        except planview.NoSuchTask as exc:
            raise UsageError(str(exc)) from None
        print(json.dumps(planview.one_task_json(task), indent=2) if args.json
              else planview.one_task(task))
        return exits.OK
    if args.json:
        print(planview.dumps(planview.plan_json(plan)))
        return exits.OK
    if ports_auto:
        print("# ports.base is auto: these ports are free now; a launch picks again")
    if plan.unresolved:
        print("# <address of IF on HOST>: that interface's IPv4 address, read by the "
              "host's agent when the job starts")
    print(planview.render_plan(plan))
    return exits.OK


def _launch(launch: Launch, first_plan: Plan, args: argparse.Namespace,
            views: outlets.Outlets) -> int:
    config = launch.loaded.config
    printer = Printer([t.label for t in first_plan.tasks], quiet=args.quiet,
                      verbose=args.verbose, live=None if args.live else False,
                      on_terminal_lost=_stdout_gone)
    previous_hangup = _watch_terminal(printer)
    simulated = transport_traits(config.transport).simulated
    if transport_traits(config.transport).ssh and not args.verbose:  # -v: paramiko's tracebacks
        quiet_paramiko_logs()
    transport = make_transport(config)
    printer.notice(
        f"job {config.name!r}: {len(first_plan.tasks)} tasks on {len(first_plan.hosts)} "
        f"{'simulated ' if simulated else ''}hosts, "
        f"strategy {config.strategy}"
    )  # the run directory is named once it exists: a launch that fails first writes none
    for line in filter(None, [planview.memory_line(first_plan), *views.said]):
        printer.notice(line)
    with stops_asked() as stop:  # until the summary is written
        ended = run_launch(launch, first_plan, transport, printer, stop,
                           max_restarts=args.max_restarts, views=views.views,
                           started=lambda _job: printer.notice(f"run dir {launch.run_dir}"))
        if isinstance(ended, Outcome) and ended.unwritten is not None:
            say(f"mgpu-launch: cannot write {launch.run_dir / rundir.SUMMARY} "
                f"({ended.unwritten}); it is:\n"
                + json.dumps(ended.summary, indent=2, default=str))
    if isinstance(ended, EarlyEnd):
        views.close()
        return _done(printer, previous_hangup, _early_end(ended, printer, launch.run_dir))
    if ended.drops:  # said once, with the counts
        printer.notice(ended.drops)
    _print_outcome(printer, ended.result, launch.run_dir)
    if ended.stop is not None:
        printer.notice(ended.stop["said"])
    return _done(printer, previous_hangup, exit_code(ended.result))


def _early_end(ended: EarlyEnd, printer: Printer, run_dir: Path) -> int:
    """A launch that ended before its job started: a host not reached or not fit
    is exit 2, a stop meanwhile 128 + the signal (recorded for a detached launcher)."""
    if ended.why == "interrupted":
        signum = ended.signum or signal.SIGINT
        say("mgpu-launch: interrupted")
        control.record_early_end(run_dir, "interrupted", "stopped while reaching the hosts",
                                 interrupted_by=signum)
        return exits.by_signal(signum)
    for line in ended.notices:
        printer.notice(line)
    say("mgpu-launch: " + "\nmgpu-launch: ".join(ended.reasons))
    first = ended.reasons[0]
    control.record_early_end(run_dir, "failed",
                             first.splitlines()[0] if ended.why == "refused" else first)
    return exits.USAGE


# ---------------------------------------------------------------- the terminal


def silence_fds(*fds: int) -> None:
    """Point `fds` at /dev/null: a pipe or terminal that is gone takes no more
    writes, and Python's flush of stdout at exit has nothing to complain about
    ("Exception ignored ... BrokenPipeError")."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        for fd in fds:
            try:
                os.dup2(null, fd)
            except OSError:
                pass
    finally:
        os.close(null)


def _gone_fds(tty_gone: bool) -> list[int]:
    """stdout, and stderr when it went the same way (the same pipe, or the
    terminal that hung up)."""
    fds = [1]
    try:
        if os.path.sameopenfile(1, 2) or (tty_gone and os.isatty(2)):
            fds.append(2)
    except OSError:
        pass
    return fds


def _stdout_gone(reason: str) -> None:
    """The printer found the terminal gone (called once, from its writer thread)."""
    silence_fds(*_gone_fds(tty_gone=reason == "EIO"))


def _watch_terminal(printer: Printer):
    """SIGHUP (the SSH session to the login node dropped, the terminal closed)
    and SIGPIPE do not end the job: the terminal is given up, the job runs on
    and everything still goes to the run directory. Returns the previous
    SIGHUP handler."""
    def hangup(_signum, _frame) -> None:
        printer.terminal_gone("SIGHUP")
        silence_fds(*_gone_fds(tty_gone=True))

    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a closed pipe: EPIPE, seen by the printer
    return signal.signal(signal.SIGHUP, hangup)


def _done(printer: Printer, previous_hangup, code: int) -> int:
    """The last of a run: let the terminal take the last lines (bounded)."""
    printer.finish()
    signal.signal(signal.SIGHUP, previous_hangup)
    return code


def exit_code(result: RunResult) -> int:
    if result.status == "succeeded":
        return exits.OK
    if result.status == "interrupted":
        return exits.by_signal(result.interrupted_by or signal.SIGINT)
    return exits.FAILED


def _print_outcome(printer: Printer, result: RunResult, run_dir: Path) -> None:
    """The end of a run in a few lines: how it went, each task, why it failed,
    where to look next."""
    restarts = (f"{result.restarts} restart{'s' if result.restarts != 1 else ''}"
                if result.restarts else "no restarts")
    status = result.status
    if result.interrupted_by:
        status += f" by {signal_name(result.interrupted_by)}"
    printer.notice(f"job {status} in {format_duration(result.wall_s)} ({restarts})")
    if result.status == "interrupted" and result.message:
        printer.notice(f"  {result.message}")
    for line in _task_summary(result.tasks):
        printer.notice(f"  {line}")
    cause = result.root_cause
    earlier = [f for f in result.failures if f is not cause]
    if earlier:
        printer.notice("restarted after:")
        for failure in earlier:
            printer.notice(f"  {failure.describe()}")
    where = shown(run_dir)
    if cause is not None:
        printer.notice(f"root cause: {cause.describe()}")
        if cause.stack:
            printer.notice("where it was stuck (innermost frame first; all threads in "
                           f"{where / rundir.STACKS}/):")
            for frame in cause.stack:
                printer.notice(f"  {frame}")
        _print_last_words(printer, cause)
        printer.notice(f"its log: {where / rundir.LOGS / (cause.task.replace('/', '-') + '.log')}")
    printer.notice(f"logs: {where / rundir.LOGS}/   summary: {where / rundir.SUMMARY}")
    task = cause.task if cause is not None else "[TASK]"
    printer.notice(f"more: mgpu-launch status {where}   mgpu-launch logs {where} {task}")


def _print_last_words(printer: Printer, cause: Failure) -> None:
    """The root cause's last output lines and, when it raised, its traceback
    once (the output's copy of it is left out)."""
    lines = list(cause.last_lines)
    error = cause.error or {}
    if error.get("traceback"):
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
        lines = lines[:starts[-1]] if starts else []  # the rest is the traceback below
    if lines:
        printer.notice("its last lines:")
        for line in lines[-10:]:
            printer.notice(f"  {line}")
    if error.get("traceback"):
        printer.notice("traceback (most recent call last):\n" + error["traceback"].rstrip())
        if error.get("type"):
            printer.notice(f"{error['type']}: {error.get('message', '')}")


# Beyond this many tasks the summary counts states and lists only the odd ones.
SUMMARY_TASKS = 8


def _task_summary(tasks: dict[str, dict]) -> list[str]:
    """One line per task: final state, exit, last step and loss."""
    shown = list(tasks.items())
    lines = []
    if len(shown) > SUMMARY_TASKS:
        counts: dict[str, int] = {}
        for _, task in shown:
            counts[task["state"]] = counts.get(task["state"], 0) + 1
        lines.append(f"{len(shown)} tasks: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
        common = max(counts, key=lambda s: counts[s])
        shown = [(label, t) for label, t in shown if t["state"] != common][:SUMMARY_TASKS]
    width = max((len(label) for label, _ in shown), default=0)
    for label, task in shown:
        parts = [f"{label:<{width}}", f"{task['state']:<9}"]
        if task["state"] in ("stopped", "succeeded"):
            pass  # how the launcher stopped it, or a clean exit: nothing to say
        elif task.get("signal"):
            parts.append(f"signal {task['signal']} ({signal_name(task['signal'])})")
        elif task.get("exit_code") not in (None, 0):
            parts.append(f"exit code {task['exit_code']}")
        progress = task.get("last_progress") or {}
        if isinstance(progress.get("step"), int | float):
            parts.append(f"step {int(progress['step'])}")
        if isinstance(progress.get("loss"), int | float):
            parts.append(f"loss {progress['loss']:.4g}")
        lines.append("  ".join(parts).rstrip())
    return lines


if __name__ == "__main__":
    sys.exit(main())
