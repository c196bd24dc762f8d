"""The run directory: `config.yaml`, `logs/`, `events.jsonl`, `summary.json`.

Owns the run directory's layout (the names below: every launcher-side module
that reads or writes a run directory uses them) and every file the launcher
writes about a run. Written only from the supervisor thread. Files are created
readable by the user only: logs can contain anything a training script prints.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# The run directory's layout (docs/operations.md); names, not paths.
CONFIG = "config.yaml"  # the cluster file as the launch read it
EVENTS = "events.jsonl"  # one JSON event per line, appended as the run goes
# The schema of events.jsonl, written as `"v": 2` on every line (launcher/job/record/events.py
# defines the kinds); a line without `v` is of version 1 (before the typed events).
EVENTS_SCHEMA = 2
SUMMARY = "summary.json"  # the outcome, written once the run has ended
LOGS = "logs"  # folder: one log per task, named by log_file_name()
STACKS = "stacks"  # folder: the Python stacks of stuck tasks, one file per task
HOSTS = "hosts"  # folder: each simulated host's own files (--local)
# Written by `mgpu-launch --detach` (launcher/commands/control.py) before the launcher
# starts: its pid and host, and its stdout/stderr.
LAUNCHER_PID = "launcher.pid"
LAUNCHER_OUT = "launcher.out"
STOP_MARK = "stop.requested"  # made by the first `mgpu-launch stop`


@dataclass(frozen=True)
class RunFiles:
    """A run directory's files as read once (launcher/outlets/rundir.py), for
    the views to fold and render (launcher/views/records.py)."""

    run_dir: Path
    config: dict[str, Any]  # config.yaml ({}: none, or not readable)
    events: list[dict[str, Any]]  # events.jsonl's complete lines
    summary: dict[str, Any] | None  # summary.json (None: the run has not ended)
    detached: dict[str, Any] | None  # launcher.pid's fields (a detached launch)
    launcher_alive: bool | None  # a run not ended: its launcher runs (None: cannot tell)
    launcher_out: Path | None = None  # a detached launcher's own output, where there is one
    logs: frozenset[str] | None = None  # the names in logs/ (None: not read)
    summary_written: bool = False  # summary.json is there (read or not)


def log_file_name(host: str, name: str) -> str:
    """`host0-worker0.log`: a task's log file in the run directory's `logs/`."""
    return f"{host}-{name}.log"


def why_unwritable(run_dir: Path) -> str | None:
    """Why a run could not write `run_dir` (None: it could), found by doing what
    the run would: its missing folders made (or, when it exists, a folder made
    in it), then removed again, so that a refused run leaves nothing behind."""
    missing: list[Path] = []
    current = Path(run_dir)
    while not current.is_dir():
        if os.path.lexists(current):
            return f"{current} is not a directory"
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    trial = missing[::-1] or [Path(run_dir) / f".mgpu-launch-probe-{os.getpid()}"]
    made: list[Path] = []
    try:
        for folder in trial:
            try:
                folder.mkdir(mode=0o700)
            except FileExistsError:
                if folder.is_dir():
                    continue  # made meanwhile, by someone else: theirs to keep
                raise
            made.append(folder)
    except OSError as exc:
        return f"{exc.strerror or exc} ({folder.parent})"
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None


def _private_open(path: Path, mode: str) -> IO[str]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC),
                 0o600)
    return os.fdopen(fd, mode, buffering=1)


class RunRecorder:
    def __init__(self, run_dir: Path, clock=time.time) -> None:
        self.run_dir = Path(run_dir)
        self.logs_dir = self.run_dir / LOGS
        created = not self.run_dir.exists()
        self.logs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if created:  # never loosen or tighten a folder the user made
            os.chmod(self.run_dir, 0o700)
        self._clock = clock
        self._events = _private_open(self.run_dir / EVENTS, "a")
        self._logs: dict[str, IO[str]] = {}
        self._lock = threading.Lock()  # events may come from a view's thread (notify)
        self.write_errors = 0  # events and log lines the disk did not take

    def write_config(self, text: str) -> None:
        with _private_open(self.run_dir / CONFIG, "w") as handle:
            handle.write(text)

    def event(self, event: str, **fields: Any) -> dict[str, Any]:
        record = {"t": round(self._clock(), 6), "event": event, "v": EVENTS_SCHEMA, **fields}
        try:
            with self._lock:
                self._events.write(json.dumps(record, default=str) + "\n")
        except OSError:  # a full disk must not end a job of days: counted, not raised
            self.write_errors += 1
        return record

    def log_line(self, log_name: str, text: str) -> None:
        try:
            handle = self._logs.get(log_name)
            if handle is None:
                handle = self._logs[log_name] = _private_open(self.logs_dir / log_name, "a")
            handle.write(text + "\n")
        except OSError:
            self.write_errors += 1

    def write_stacks(self, name: str, label: str, generation: int, text: str) -> Path:
        """Add a task's Python stacks to `stacks/<name>.txt` (one section per dump)."""
        folder = self.run_dir / STACKS
        folder.mkdir(mode=0o700, exist_ok=True)
        path = folder / f"{name}.txt"
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self._clock()))
        with _private_open(path, "a") as handle:
            handle.write(f"# {label}, generation {generation}, taken {stamp} "
                         f"(most recent call first)\n{text.rstrip()}\n\n")
        return path

    def write_summary(self, summary: dict[str, Any]) -> None:
        path = self.run_dir / SUMMARY
        tmp = path.with_suffix(".json.tmp")
        with _private_open(tmp, "w") as handle:
            json.dump(summary, handle, indent=2, default=str)
            handle.write("\n")
        os.replace(tmp, path)

    def close(self) -> None:
        for handle in [*self._logs.values(), self._events]:
            try:
                handle.close()
            except OSError:  # the last buffered lines of a full disk
                self.write_errors += 1
