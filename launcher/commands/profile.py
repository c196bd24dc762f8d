"""`mgpu-launch profile RUN_DIR [--seconds S]`: one synchronized trace of a running job.

Where does each task's step time go: computing, waiting in collectives for its
peers, or waiting for its input? This command asks the run's launcher (through
`RUN_DIR/profiles/request.json`, which its supervisor looks for twice a
second: launcher/job/run/profiling.py) to have every task trace itself for S
seconds, all at the same moment, then waits for the capture's
`RUN_DIR/profiles/<id>/summary.json` and prints one line per task. The traces
are under `RUN_DIR/profiles/<id>/`, laid out for TensorBoard's profile plugin
(`tensorboard --logdir RUN_DIR/profiles/<id>`). docs/profiles.md.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..job.run.profiling import ANSWER_MARGIN_S, DELAY_S, MAX_SECONDS, PROFILES, REQUEST, SUMMARY
from ..job.run.profiling import new_id as new_trace_id
from ..outlets.rundir import launcher_of
from ..spec.rundir import CONFIG
from ..spec.rundir import SUMMARY as RUN_SUMMARY
from ..strategy import Strategy
from . import exits, usage
from .control import launcher_process
from .usage import say

POLL_S = 0.1
TAKEN_WITHIN_S = 5.0  # the launcher looks for a request every 0.5 s; a loaded one later

PROFILE_USAGE = """\
mgpu-launch profile RUN_DIR [--seconds S] [--allow-restart]

Traces every task of a running job for S seconds (default 2), all at the same
moment, and prints per task: the step time and, per step, the time in
collective ops (waiting for peers), waiting for input, and computing. The
traces go to RUN_DIR/profiles/<time>/ (open them with
`tensorboard --logdir RUN_DIR/profiles/<time>`, Profile tab).

TensorFlow 2.21's profiler can crash a MultiWorkerMirroredStrategy task when
a trace stops; the job then restarts from its last checkpoint (docs/profiles.md).
Such a job is traced only with --allow-restart.

exit codes: 0 every task traced; 1 some tasks did not answer (named); 2 RUN_DIR
is not a running job."""


class NotRunning(Exception):
    """RUN_DIR is not a job that runs now (the words say why)."""


def ask(run_dir: Path, seconds: float) -> str:
    """Leave a request for the run's launcher; returns the capture's id."""
    folder = run_dir / PROFILES
    folder.mkdir(mode=0o700, exist_ok=True)
    ident = new_trace_id()
    while (folder / ident).exists():  # two captures within one second
        ident = new_trace_id() + f"-{int(time.time() * 1000) % 1000:03d}"
    tmp = folder / (REQUEST + f".{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"id": ident, "seconds": seconds}, handle)
    os.replace(tmp, folder / REQUEST)
    return ident


def check_running(run_dir: Path) -> None:
    """Raise NotRunning unless RUN_DIR's job runs now."""
    if not run_dir.is_dir():
        raise NotRunning(f"{run_dir}: no such directory")
    if (run_dir / RUN_SUMMARY).exists():
        raise NotRunning(f"{run_dir}: the job has finished (summary.json is written); "
                         "only a running job can be traced")
    launcher = launcher_of(run_dir)
    if launcher is None:
        raise NotRunning(f"{run_dir}: not a run directory, or its launcher has not started "
                         "yet (no launch event, no launcher.pid)")
    host = launcher.get("launcher_host")
    if (not host or host == socket.gethostname()) and launcher_process(launcher) is None:
        raise NotRunning(f"{run_dir}: its launcher (pid {launcher.get('launcher_pid')}) is "
                         "gone and wrote no summary.json: the job is not running")


def wait_for(run_dir: Path, ident: str, seconds: float) -> dict[str, Any] | None:
    """The capture's summary, or None if none came in time (the request is then taken back)."""
    request = run_dir / PROFILES / REQUEST
    result = run_dir / PROFILES / ident / SUMMARY
    start = time.monotonic()
    deadline = start + TAKEN_WITHIN_S + DELAY_S + seconds + ANSWER_MARGIN_S + 5
    while time.monotonic() < deadline:
        if result.exists():
            try:
                return json.loads(result.read_text(encoding="utf-8"))
            except ValueError:
                pass  # written by os.replace: whole, or not there
        untaken = request.exists() and time.monotonic() - start > TAKEN_WITHIN_S
        if untaken and ((run_dir / RUN_SUMMARY).exists() or _withdraw(request)):
            return None
        time.sleep(POLL_S)
    return None


def _withdraw(request: Path) -> bool:
    try:
        request.unlink()
    except OSError:
        return False
    return True


def table(capture: dict[str, Any]) -> list[str]:
    """One line per task: step time, then per step collectives, input, compute."""
    rows = [("task", "host", "steps", "step", "collectives", "input", "compute")]
    notes = []
    tasks = capture.get("tasks") or {}
    for name, entry in tasks.items():
        figures = entry.get("summary") or {}
        steps, step = figures.get("steps") or 0, figures.get("step_s")
        window = figures.get("window_s") or 0.0
        per = steps if steps else 1
        rows.append((name, entry.get("host", ""), str(steps) if figures else "-",
                     _ms(step), *(_part(figures.get(key), per, window)
                                  for key in ("collective_s", "input_s", "compute_s"))))
        if entry.get("error"):
            notes.append(f"{name}: {entry['error']}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
             for row in rows]
    if any((e.get("summary") or {}).get("steps") == 0 for e in tasks.values()):
        notes.append("steps 0: no training step in the window; figures are totals over it")
    for name, why in (capture.get("missing") or {}).items():
        notes.append(f"{name}: no trace: {why}")
    return lines + notes


def _ms(seconds: Any) -> str:
    return f"{seconds * 1000:.1f} ms" if isinstance(seconds, int | float) else "-"


def _part(total: Any, steps: int, window: float) -> str:
    if not isinstance(total, int | float):
        return "-"
    share = f" ({100 * total / window:.0f} %)" if window else ""
    return _ms(total / steps) + share


# Strategies whose tasks TF 2.21's profiler may crash at stop() (docs/profiles.md).
CRASH_PRONE = {Strategy.MULTI_WORKER_MIRRORED: "MultiWorkerMirroredStrategy"}


def strategy_of(run_dir: Path) -> str | None:
    """The run's strategy, from the cluster file it kept (config.yaml)."""
    try:
        config = yaml.safe_load((run_dir / CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return None
    return config.get("strategy") if isinstance(config, dict) else None


def profile(run_dir: Path, seconds: float, allow_restart: bool = False) -> int:
    try:
        check_running(run_dir)
    except NotRunning as exc:
        say(f"mgpu-launch profile: {exc}")
        return exits.USAGE
    prone = CRASH_PRONE.get(strategy_of(run_dir) or "")
    if prone and not allow_restart:
        say(f"mgpu-launch profile: TensorFlow 2.21's profiler can crash a {prone} task "
            "when its trace stops (seen in 1 to 4 traces, docs/profiles.md); the job would "
            "then restart from its last checkpoint. Run again with --allow-restart to "
            "trace it anyway.")
        return exits.USAGE
    ident = ask(run_dir, seconds)
    folder = run_dir / PROFILES / ident
    say(f"tracing every task of {run_dir} for {seconds:g} s ...", sys.stdout)
    capture = wait_for(run_dir, ident, seconds)
    if capture is None:
        say(f"mgpu-launch profile: the launcher of {run_dir} did not take the request "
            "(it is ending, or it predates `profile`)")
        return exits.USAGE
    if capture.get("error"):
        say(f"mgpu-launch profile: {capture['error']}")
        return exits.PARTIAL
    for line in table(capture):
        say(line, sys.stdout)
    say(f"traces: {folder} (tensorboard --logdir {folder}, Profile tab)", sys.stdout)
    return exits.PARTIAL if capture.get("missing") or any(
        e.get("error") for e in capture.get("tasks", {}).values()) else exits.OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text} is not within 0.1 to {MAX_SECONDS:g} s")
    return value


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `profile` (as dispatched by the CLI)."""
    parser = usage.parser_for("mgpu-launch profile", PROFILE_USAGE)
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--seconds", type=_seconds, default=2.0, metavar="S",
                        help="how long each task traces (default 2; 0.1 to 60)")
    parser.add_argument("--allow-restart", action="store_true",
                        help="trace a MultiWorkerMirroredStrategy job even though TF's "
                        "profiler may crash a task of it (the job then restarts)")
    args = parser.parse_args(list(argv)[1:])
    try:
        return profile(Path(args.run_dir), args.seconds, args.allow_restart)
    except KeyboardInterrupt:
        return exits.INTERRUPTED
