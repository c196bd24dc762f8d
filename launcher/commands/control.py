"""Runs that outlive their terminal: `mgpu-launch --detach ...` and
`mgpu-launch stop RUN_DIR`.

`detach()` starts the same command line again as a launcher of its own: in
its own session (no terminal, so no SIGHUP, no Ctrl-C of the caller's shell),
stdin from /dev/null, stdout and stderr to RUN_DIR/launcher.out (0600). The
run directory is decided (and created) before, so the path printed is the
one the launcher writes; its pid goes to RUN_DIR/launcher.pid.

`stop` sends SIGTERM to a run's launcher, which stops every task (SIGTERM,
grace, SIGKILL) and writes summary.json (status interrupted), and waits for
that summary. It signals only a process that is the run's launcher: the pid
must belong to an mgpu-launch process started before the run's launch.

The run command imports this module before it reaches the hosts: the job's
modules (events, states, records) are imported where used, not at its top.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..outlets.rundir import launcher_of
from ..spec.rundir import (
    CONFIG,
    EVENTS,
    LAUNCHER_OUT,
    LAUNCHER_PID,
    STOP_MARK,
    SUMMARY,
    RunRecorder,
)
from . import exits, usage
from .usage import say

# Files `--detach` puts into the run directory before the launcher starts.
DETACH_FILES = frozenset({LAUNCHER_OUT, LAUNCHER_PID})
# Set by detach() for the launcher it starts: the run directory it prepared.
# Taken out of the environment when the launcher starts (take_detached_run_dir),
# so that tasks do not inherit it.
DETACHED_RUN_DIR_ENV = "MGPU_DETACHED_RUN_DIR"
_detached_run_dir: str | None = None
# STOP_MARK is made by the first `stop` (O_EXCL): a second one must not signal
# again (a second SIGTERM means "kill now" to the launcher).
# `stop` waits this much beyond the run's grace_s for summary.json.
STOP_MARGIN_S = 30.0
POLL_S = 0.1


# -------------------------------------------------------------------- detach


def take_detached_run_dir() -> None:
    """Read (and remove) the run directory `detach()` handed to this launcher.
    The CLI calls it first thing, before it starts anything."""
    global _detached_run_dir
    value = os.environ.pop(DETACHED_RUN_DIR_ENV, None)
    if value is not None:
        _detached_run_dir = value


def is_detached_child(run_dir: Path) -> bool:
    return _detached_run_dir is not None and Path(_detached_run_dir) == run_dir


def run_dir_free(run_dir: Path) -> bool:
    """A new run may use `run_dir`: it does not exist, is empty, or holds only
    what `--detach` put there for this very launcher."""
    if not run_dir.exists():
        return True
    names = {p.name for p in run_dir.iterdir()}
    return not names or (is_detached_child(run_dir) and names <= DETACH_FILES)


def _child_argv(argv: Sequence[str], rest: Sequence[str], run_dir: Path,
                metrics_port: int | None = None) -> list[str]:
    """The same command line for the background launcher: the options given
    (without --detach), then ours (later options win), then CLUSTER/SCRIPT/args
    untouched (they may contain a --detach of the script's own)."""
    options = list(argv[:len(argv) - len(rest)])
    options = [o for o in options
               if not (o.startswith("--det") and "--detach".startswith(o.split("=", 1)[0]))]
    # The metrics port this launcher found free (port 0: "any"), so the one said
    # below is the one served.
    ours = ["--metrics-port", str(metrics_port)] if metrics_port is not None else []
    # --quiet: task output is in logs/; launcher.out keeps the launcher's own lines.
    return [sys.executable, "-m", "launcher", *options, "--run-dir", str(run_dir),
            *ours, "--no-live", "--quiet", *rest]


def detach(argv: Sequence[str], rest: Sequence[str], run_dir: Path, name: str,
           metrics_port: int | None = None, said: Sequence[str] = ()) -> int:
    """Start the launcher in the background and return at once. `run_dir` is
    absolute: the path printed must work from any directory (`RUN=$(...)`)."""
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if created:
        os.chmod(run_dir, 0o700)  # as RunRecorder does: logs may hold anything
    out = os.open(run_dir / LAUNCHER_OUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    env = dict(os.environ)
    env[DETACHED_RUN_DIR_ENV] = str(run_dir)
    # `-m launcher` must find this very package, however mgpu-launch was started.
    package_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(_child_argv(argv, rest, run_dir, metrics_port),
                                stdin=subprocess.DEVNULL,
                                stdout=out, stderr=out, env=env, start_new_session=True)
    finally:
        os.close(out)
    fd = os.open(run_dir / LAUNCHER_PID, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{proc.pid} {socket.gethostname()}\n")
    shown = run_dir.absolute()
    # The run dir alone on stdout: RUN=$(mgpu-launch --detach ...) gets just that.
    say(str(shown), sys.stdout)
    say(f"mgpu-launch: job {name!r} runs in the background (launcher pid {proc.pid}); "
        f"its own output: {shown / LAUNCHER_OUT}\n"
        + "".join(f"  {line}\n" for line in said) +
        f"  mgpu-launch status {shown}      how it goes\n"
        f"  mgpu-launch logs {shown} -f     follow every task's output\n"
        f"  mgpu-launch stop {shown}        stop it (tasks get their grace period to save)")
    return exits.OK


def record_early_end(run_dir: Path, status: str, message: str,
                     interrupted_by: int | None = None) -> None:
    """A launch that ends before its job starts still leaves a summary when it
    was interrupted (Ctrl-C, SIGTERM, `stop`), and, for a detached launcher,
    whose terminal nobody watches, also when a host could not be reached (a
    foreground one says that on the terminal, with exit code 2)."""
    if status != "interrupted" and not is_detached_child(run_dir):
        return
    from ..job.record import events
    from ..job.record.states import JobStatus, RunResult

    try:
        recorder = RunRecorder(run_dir)
        events.write(recorder, events.JobDone(status=status, message=message))
        recorder.write_summary(RunResult(status=JobStatus(status), restarts=0, wall_s=0.0,
                                         root_cause=None, tasks={}, message=message,
                                         interrupted_by=interrupted_by).to_json())
        recorder.close()
    except OSError:  # a run directory we cannot write: the exit code still says it
        pass


# ---------------------------------------------------------------------- stop


def launcher_process(launcher: dict[str, Any]):
    """The run's launcher as a psutil.Process, or None when it is gone. A pid
    now used by another program (started after the run, or not mgpu-launch)
    counts as gone."""
    import psutil

    try:
        proc = psutil.Process(int(launcher["launcher_pid"]))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        if proc.create_time() > float(launcher.get("t", 0.0)) + 1.0:
            return None
        cmdline = " ".join(proc.cmdline())
    except (psutil.Error, KeyError, ValueError, TypeError):
        return None
    return proc if "launcher" in cmdline or "mgpu-launch" in cmdline else None


def _grace_s(run_dir: Path) -> float:
    try:
        import yaml

        config = yaml.safe_load((run_dir / CONFIG).read_text()) or {}
        return float((config.get("restart") or {}).get("grace_s", 3.0))
    except Exception:  # noqa: BLE001 - no or a broken config.yaml: the default grace
        return 3.0


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((run_dir / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _outcome(summary: dict[str, Any]) -> str:
    status = str(summary.get("status", "?"))
    if summary.get("interrupted_by"):
        try:
            status += f" by {signal.Signals(int(summary['interrupted_by'])).name}"
        except ValueError:
            status += f" by signal {summary['interrupted_by']}"
    wall = summary.get("wall_s")
    took = f" after {wall:.1f} s" if isinstance(wall, int | float) else ""
    restarts = summary.get("restarts") or 0
    return f"{status}{took} ({restarts} restart{'s' if restarts != 1 else ''})"


def _stop_requested(run_dir: Path) -> float | None:
    """When a stop was asked for already (a `stop`, or Ctrl-C/SIGTERM seen by
    the launcher), else None."""
    from ..outlets.rundir import read_events

    try:
        return (run_dir / STOP_MARK).stat().st_mtime
    except OSError:
        pass
    return next((float(e.get("t", 0)) for e in read_events(run_dir / EVENTS)
                 if e.get("event") == "stop_requested"), None)


def _claim_stop(run_dir: Path) -> bool:
    """True for the one `stop` that may signal; False when another got there first."""
    try:
        fd = os.open(run_dir / STOP_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    except OSError:  # a run directory we cannot write to: the events must do
        return _stop_requested(run_dir) is None
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()} {time.time():.3f}\n")
    return True


def stop(run_dir: Path, timeout_s: float | None = None) -> int:
    if not run_dir.is_dir():
        say(f"mgpu-launch stop: {run_dir}: no such directory")
        return exits.USAGE
    summary = _read_summary(run_dir)
    if summary is not None:
        say(f"{run_dir}: the job already finished: {_outcome(summary)}; nothing to stop",
            sys.stdout)
        return exits.OK
    launcher = launcher_of(run_dir)
    if launcher is None:
        say(f"mgpu-launch stop: {run_dir}: not a run directory, or its launcher has not "
            "started yet (no launch event, no launcher.pid)")
        return exits.USAGE
    host = launcher.get("launcher_host")
    if host and host != socket.gethostname():
        say(f"mgpu-launch stop: the launcher of {run_dir} runs on {host}: "
            "run `mgpu-launch stop` there")
        return exits.USAGE
    pid = launcher["launcher_pid"]
    proc = launcher_process(launcher)
    if proc is None:
        summary = _read_summary(run_dir)  # it may have ended just now
        if summary is not None:
            say(f"{run_dir}: the job already finished: {_outcome(summary)}; nothing to stop",
                sys.stdout)
            return exits.OK
        say(f"mgpu-launch stop: the launcher of {run_dir} (pid {pid}) is gone and wrote no "
            "summary.json (killed, or its machine rebooted): nothing to stop; its agents "
            "stopped the tasks when it died")
        return exits.NOT_STOPPED
    from ..job.policy.stops import HOW_TO_SAVE

    grace = _grace_s(run_dir)
    timeout_s = grace + STOP_MARGIN_S if timeout_s is None else timeout_s
    if _stop_requested(run_dir) is None and _claim_stop(run_dir):
        try:
            proc.send_signal(signal.SIGTERM)
        except Exception as exc:  # noqa: BLE001 - psutil.AccessDenied, NoSuchProcess
            (run_dir / STOP_MARK).unlink(missing_ok=True)
            say(f"mgpu-launch stop: cannot signal the launcher (pid {pid}): {exc}")
            return exits.NOT_STOPPED
        say(f"stopping {run_dir}: SIGTERM sent to the launcher (pid {pid}); the tasks get "
            f"SIGTERM, then SIGKILL after {grace:g} s; {HOW_TO_SAVE}, else it resumes from "
            f"its last checkpoint; waiting up to {timeout_s:g} s", sys.stdout)
    else:
        since = time.time() - (_stop_requested(run_dir) or time.time())
        say(f"{run_dir}: a stop is already under way (asked {since:.0f} s ago); waiting up "
            f"to {timeout_s:g} s for it, without signalling again", sys.stdout)
    return _wait_for_summary(run_dir, proc, timeout_s)


def _wait_for_summary(run_dir: Path, proc, timeout_s: float) -> int:
    import psutil

    deadline = time.monotonic() + timeout_s
    gone_at: float | None = None
    while time.monotonic() < deadline:
        summary = _read_summary(run_dir)
        if summary is not None:
            said = (summary.get("stop") or {}).get("said")
            say(f"{run_dir}: job {_outcome(summary)}; summary: {run_dir / SUMMARY}"
                + (f"\n{said}" if said else ""), sys.stdout)
            return exits.OK
        try:
            running = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            running = False
        if not running:
            gone_at = gone_at or time.monotonic()
            if time.monotonic() - gone_at > 1.0:  # the summary is written before exit
                say(f"mgpu-launch stop: the launcher of {run_dir} exited without writing "
                    f"{SUMMARY}")
                return exits.NOT_STOPPED
        time.sleep(POLL_S)
    say(f"mgpu-launch stop: {run_dir} is still running after {timeout_s:g} s (the launcher "
        f"may be waiting for a host); `mgpu-launch stop` again waits again, "
        f"`kill -TERM {proc.pid}` kills its tasks at once")
    return exits.NOT_STOPPED


STOP_USAGE = """\
mgpu-launch stop RUN_DIR [--timeout S]

Stops a running job gracefully: SIGTERM to its launcher, which sends SIGTERM
to every task, waits the run's grace_s, then SIGKILLs, and writes
summary.json (status interrupted). Waits for that summary (at most S seconds;
default grace_s + 30). A stop already under way is waited for, not repeated.

exit codes: 0 the job is over (stopped now or by a stop already under way, or
it had finished before); 1 not stopped (still running after S seconds, or its
launcher is gone without a summary); 2 RUN_DIR is not a run directory, or its
launcher runs on another machine."""


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `stop` (as dispatched by the CLI)."""
    parser = usage.parser_for("mgpu-launch stop", STOP_USAGE)
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="wait at most S seconds for the job to end (default grace_s + 30)")
    args = parser.parse_args(list(argv)[1:])
    try:
        return stop(Path(args.run_dir), args.timeout)
    except KeyboardInterrupt:
        return exits.INTERRUPTED
