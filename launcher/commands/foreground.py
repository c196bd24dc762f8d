"""The run command once its cluster is read: the launch in the foreground
(or started in the background, `--detach`), or the plan printed (`--dry-run`).

The run command (launcher/commands/run.py) parses the arguments, reads the
cluster file and, on SSH hosts, starts opening the connections; it imports
this module after that, so the job's modules (the launch, its events and
states, the printer) load while the hosts answer. From here on: the launch
(launcher/job/run/sequence.py) is called, what comes back is printed and turned
into the exit code, and the signals are this module's while it runs.

The terminal never decides the job's fate: SIGHUP and a closed stdout (EPIPE)
only make the printer stop writing; the job runs on, the run directory gets
everything and the exit code is the job's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..job.record.classify import signal_name
from ..job.record.states import JobStatus, RunResult
from ..job.record.story import restarts_words, step_of
from ..job.run.launch import Launch, LaunchRefused, Outcome
from ..job.run.sequence import EarlyEnd, run_launch
from ..outlets import launch as outlets
from ..outlets.printer import Printer
from ..spec import planview, rundir
from ..spec.config import LoadedConfig
from ..spec.plan import Plan
from ..spec.transports import traits as transport_traits
from ..transport.factory import make_transport, quiet_paramiko_logs
from ..views import narrate, rootcause
from ..views.live import format_duration
from . import control, exits, prereqs
from .signals import stops_asked
from .usage import say, shown, silence_fds


def dry_run(loaded: LoadedConfig, command: list[str], run_dir: Path,
            args: argparse.Namespace) -> int:
    """`--dry-run`: the plan printed, nothing started (`--task` naming no
    task raises planview.NoSuchTask)."""
    plan = Launch(loaded, command, run_dir, str(Path.cwd())).plan(0)
    ports_auto = loaded.config.ports.base == "auto"
    if args.task:
        task = planview.find_task(plan, args.task)
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


def run(loaded: LoadedConfig, command: list[str], run_dir: Path, args: argparse.Namespace,
        argv: Sequence[str]) -> int:
    """The run command from its loaded cluster on: the launch in the foreground
    (or, `--detach`, started in the background)."""
    try:
        return _run(loaded, command, run_dir, args, argv)
    except (LaunchRefused, outlets.OutletError) as exc:  # e.g. ports or checkpoint dir taken
        say(f"mgpu-launch: {exc}")
        return exits.USAGE


def prepare_launch(loaded: LoadedConfig, command: list[str], run_dir: Path, *,
                   claim: bool, check_python: bool = True) -> tuple[Launch, Plan]:
    """What every launch does before `run_launch` (the run command, each job of
    the drill): the launch made (every host's TF address as far as known before
    any agent answered, spares too), simulated hosts' Python checked for what
    the script needs, the checkpoint directory claimed (`claim`; a detached run
    claims it in its own process) and a moved checkpoint said. Raises
    LaunchRefused (said and exit 2 by the caller)."""
    config = loaded.config
    launch = Launch(loaded, command, run_dir, str(Path.cwd()))
    if check_python and transport_traits(config.transport).simulated:  # this Python runs them
        missing = prereqs.local_problem(launch.pythons, Path(command[0]), config.strategy)
        if missing:
            raise LaunchRefused(missing)
    prepared = launch.prepare(claim=claim)
    if prepared.moved is not None:
        say(f"mgpu-launch: {narrate.checkpoint_moved(prepared.moved)}")
    return launch, prepared.plan


def _run(loaded: LoadedConfig, command: list[str], run_dir: Path, args: argparse.Namespace,
         argv: Sequence[str]) -> int:
    launch, first_plan = prepare_launch(loaded, command, run_dir, claim=not args.detach)
    views = outlets.make_outlets(loaded, run_dir, args.metrics_port)  # a busy port: exit 2
    if args.detach:  # the background launcher makes its own
        views.close()
        return control.detach(argv, args.rest, run_dir, loaded.config.name,
                              views.metrics_port, views.said)
    return _launch(launch, first_plan, args, views)


def _launch(launch: Launch, first_plan: Plan, args: argparse.Namespace,
            views: outlets.Outlets) -> int:
    config = launch.loaded.config
    printer = Printer([t.label for t in first_plan.tasks], quiet=args.quiet,
                      verbose=args.verbose, live=None if args.live else False,
                      on_terminal_lost=_stdout_gone)
    previous_hangup = _watch_terminal(printer)
    traits = transport_traits(config.transport)
    simulated = traits.simulated
    if traits.ssh and not args.verbose:  # -v: paramiko's tracebacks
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
    _print_outcome(printer, ended.result, launch.run_dir, ended.summary.get("failures") or [])
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
    if result.status == JobStatus.SUCCEEDED:
        return exits.OK
    if result.status == JobStatus.INTERRUPTED:
        return exits.by_signal(result.interrupted_by or signal.SIGINT)
    return exits.FAILED


def _print_outcome(printer: Printer, result: RunResult, run_dir: Path,
                   failures: Sequence[dict[str, Any]] = ()) -> None:
    """The end of a run in a few lines: how it went, each task, why it failed,
    where to look next (`failures`: summary.json's, with the workers restarted
    alone, which the result does not hold)."""
    restarts = restarts_words(result.restarts, failures)
    status = result.status
    if result.interrupted_by:
        status += f" by {signal_name(result.interrupted_by)}"
    printer.notice(f"job {status} in {format_duration(result.wall_s)} ({restarts})")
    if result.status == JobStatus.INTERRUPTED and result.message:
        printer.notice(f"  {result.message}")
    for line in _task_summary(result.tasks):
        printer.notice(f"  {line}")
    cause = result.root_cause
    earlier = [f for f in result.failures if f is not cause]
    if earlier:
        printer.notice("restarted after:")
        for failure in earlier:
            printer.notice(f"  {failure.describe()}")
    alone = [f for f in failures if f.get("restarted_alone")]
    if alone:
        printer.notice("workers restarted alone (the job went on):")
        for failure in alone:
            printer.notice(f"  {failure.get('description')}")
    where = shown(run_dir)
    if cause is not None:
        for line in rootcause.lines(cause.to_json(), str(where / rundir.STACKS)):
            printer.notice(line)
        printer.notice(f"its log: {where / rundir.LOGS / (cause.task.replace('/', '-') + '.log')}")
    printer.notice(f"logs: {where / rundir.LOGS}/   summary: {where / rundir.SUMMARY}")
    task = cause.task if cause is not None else "[TASK]"
    printer.notice(f"more: mgpu-launch status {where}   mgpu-launch logs {where} {task}")


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
        step = step_of(task.get("last_progress") or {})
        if isinstance(step, int | float):
            parts.append(f"step {int(step)}")
        progress = task.get("last_progress") or {}
        if isinstance(progress.get("loss"), int | float):
            parts.append(f"loss {progress['loss']:.4g}")
        lines.append("  ".join(parts).rstrip())
    return lines
