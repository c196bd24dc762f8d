"""`mgpu-launch logs RUN_DIR [TASK] [-f] [-n N]`: a run's task logs, printed,
and followed while the job runs (until summary.json appears, or the launcher
is known to be gone).

Read-only: never writes into the run directory. Must not import supervisor,
transport or cli.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..outlets.rundir import RunDirError, launcher_alive, load_run, read_events
from ..spec.rundir import EVENTS, LOGS, SUMMARY
from ..views.records import RunView
from . import exits, usage

# How often `logs -f` looks for new lines and for summary.json.
FOLLOW_POLL_S = 0.2



def _log_files(run_dir: Path) -> list[Path]:
    logs = run_dir / LOGS
    return sorted(logs.glob("*.log")) if logs.is_dir() else []


def resolve_task_logs(view: RunView, task: str | None) -> list[tuple[str, Path]]:
    """(label, log path) of TASK, given as `worker0`, `host1/worker1` or `host1-worker1`.

    Without TASK: every task of the latest generation, then any other log file.
    A task that has not printed yet has a path that does not exist yet.
    """
    known = [(t.label, t.log_path) for t in view.tasks if t.log_path is not None]
    files = _log_files(view.run_dir)
    if task is None:
        seen = {p for _, p in known}
        extra = [(p.stem, p) for p in files if p not in seen]
        return known + extra
    wanted = task[:-4] if task.endswith(".log") else task
    for label, path in known:
        if wanted in (label, label.replace("/", "-"), path.stem):
            return [(label, path)]
    for path in files:
        if path.stem == wanted:
            return [(path.stem, path)]
    by_name = [(label, path) for label, path in known if label.split("/", 1)[1] == wanted]
    if by_name:
        return by_name
    older = [(p.stem, p) for p in files if p.stem.endswith(f"-{wanted}")]
    if older:  # e.g. a task that ran on another host in an earlier generation
        return older
    choices = ", ".join(label for label, _ in known) or "none"
    raise RunDirError(f"no task {task!r} in {view.run_dir} (tasks: {choices})")


def _tail(path: Path, count: int | None) -> tuple[list[str], int]:
    """The last `count` complete lines of `path` and the offset just after them."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    end = data.rfind(b"\n") + 1  # a partial last line is printed once it is complete
    lines = data[:end].decode(errors="replace").splitlines()
    if count is not None:
        lines = lines[-count:] if count > 0 else []
    return lines, end


class _Follower:
    """Reads what was appended to one log file since the last look."""

    def __init__(self, label: str, path: Path, offset: int) -> None:
        self.label, self.path, self.offset = label, path, offset
        self.partial = b""

    def new_lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        data = self.partial + data
        end = len(data) if final else data.rfind(b"\n") + 1
        self.partial = data[end:]
        return data[:end].decode(errors="replace").splitlines()


def follow_logs(run_dir: Path, targets: list[tuple[str, Path]], offsets: dict[Path, int],
                write: Callable[[str, str], None], timeout_s: float | None = None,
                poll_s: float = FOLLOW_POLL_S, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep,
                alive: Callable[[dict[str, Any]], bool | None] = launcher_alive) -> str:
    """Print lines as they are appended until the job ends; returns why it stopped.

    Ends when summary.json appears (after printing what was written before
    it), when the launcher is known to be gone, or after `timeout_s`.
    """
    followers = [_Follower(label, path, offsets.get(path, 0)) for label, path in targets]
    summary = run_dir / SUMMARY
    deadline = None if timeout_s is None else clock() + timeout_s
    launch = next((e for e in read_events(run_dir / EVENTS)
                   if e.get("event") == "launch"), None)
    last_alive_check = clock()
    while True:
        done = summary.exists()  # checked before reading: lines written before it are shown
        for follower in followers:
            for line in follower.new_lines(final=done):
                write(follower.label, line)
        if done:
            return "finished"
        if deadline is not None and clock() >= deadline:
            return "timeout"
        if clock() - last_alive_check > 2.0:
            last_alive_check = clock()
            if launch is None:
                launch = next((e for e in read_events(run_dir / EVENTS)
                               if e.get("event") == "launch"), None)
            if launch is not None and alive(launch) is False:
                for follower in followers:
                    for line in follower.new_lines(final=True):
                        write(follower.label, line)
                return "launcher gone"
        sleep(poll_s)


def _wait_for_launch(view: RunView, timeout_s: float | None,
                     clock: Callable[[], float] = time.monotonic) -> RunView:
    """`logs -f` of a job whose tasks are not launched yet (a detached launcher
    still reaching its hosts): wait for the launch, so there is a log to follow."""
    deadline = None if timeout_s is None else clock() + timeout_s
    while not view.tasks and not view.finished:
        if deadline is not None and clock() >= deadline:
            break
        time.sleep(FOLLOW_POLL_S)
        view = load_run(view.run_dir)
    return view


def logs_main(argv: list[str], out: TextIO) -> int:
    parser = usage.Parser(
        prog="mgpu-launch logs",
        description="Print a task's log (TASK as worker0, host1/worker1 or host1-worker1); "
        "without TASK, every task's log with a host/task prefix.")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("task", metavar="TASK", nargs="?")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing new lines until the job ends")
    parser.add_argument("-n", "--lines", type=int, metavar="N",
                        help="only the last N lines (of each log)")
    parser.add_argument("--list", action="store_true", help="list the log files and exit")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="with -f: stop after S seconds even if the job still runs")
    args = parser.parse_args(argv)
    try:
        view = load_run(args.run_dir)
        if args.follow and not view.tasks and not view.finished:
            waited = time.monotonic()
            view = _wait_for_launch(view, args.timeout)
            if args.timeout is not None:  # one bound for the whole command
                args.timeout = max(0.0, args.timeout - (time.monotonic() - waited))
        targets = resolve_task_logs(view, args.task)
    except RunDirError as exc:
        print(f"mgpu-launch logs: {exc}", file=sys.stderr)
        return exits.USAGE

    if args.list:
        for label, path in targets:
            size = f"{path.stat().st_size} bytes" if path.exists() else "no output yet"
            out.write(f"{label}  {path}  ({size})\n")
        return exits.OK

    prefixed = args.task is None and len(targets) > 1
    width = max((len(label) for label, _ in targets), default=0)

    def write(label: str, line: str) -> None:
        out.write(f"{label:<{width}} | {line}\n" if prefixed else line + "\n")
        out.flush()

    offsets: dict[Path, int] = {}
    for label, path in targets:
        lines, offsets[path] = _tail(path, args.lines)
        for line in lines:
            write(label, line)
    if not args.follow:
        return exits.OK
    if view.finished:
        # Nothing more will come; print a partial last line, if any.
        for label, path in targets:
            for line in _Follower(label, path, offsets[path]).new_lines(final=True):
                write(label, line)
        return exits.OK
    try:
        follow_logs(view.run_dir, targets, offsets, write, timeout_s=args.timeout)
    except KeyboardInterrupt:
        return exits.INTERRUPTED
    return exits.OK
