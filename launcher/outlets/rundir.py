"""A run directory read, once: what the launcher wrote (`config.yaml`,
`events.jsonl`, `summary.json`, `launcher.pid`) and whether the launcher that
writes it still runs (psutil), as `RunFiles` (launcher/spec/rundir.py) for the
views to render (launcher/views/records.py: `run_view`). Used by `status`,
`status --watch`, `logs`, `report` and the control commands.

Read-only: never writes into the run directory. A run still going is read as
far as it got (a half-written last line of events.jsonl is skipped).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..spec.rundir import CONFIG, EVENTS, LAUNCHER_OUT, LAUNCHER_PID, LOGS, SUMMARY, RunFiles
from ..views.records import RunView, run_view


class RunDirError(Exception):
    """RUN_DIR is not a run directory (or not one we can read)."""


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event; a half-written last line (job still running) is skipped."""
    events = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            events.append(record)
    return events


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def read_launcher_pid(run_dir: Path) -> dict[str, Any] | None:
    """launcher.pid of a detached run (`PID HOST`) as a launch event's fields;
    `t` is when the file was written, just after the launcher was started."""
    try:
        path = run_dir / LAUNCHER_PID
        words = path.read_text().split()
        return {"launcher_pid": int(words[0]),
                "launcher_host": words[1] if len(words) > 1 else None,
                "t": path.stat().st_mtime}
    except (OSError, ValueError, IndexError):
        return None


def launcher_alive(launch: dict[str, Any], this_host: str | None = None) -> bool | None:
    """Whether the launcher that wrote `launch` still runs; None when it cannot be told.

    Needs `launcher_pid` and `launcher_host` in the `launch` event. A pid whose
    process started after the launch event was reused by another program.
    """
    pid, host = launch.get("launcher_pid"), launch.get("launcher_host")
    if not isinstance(pid, int) or not host:
        return None
    if host != (this_host or socket.gethostname()):
        return None
    try:
        import psutil

        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:  # dead, its parent did not reap it yet
            return False
        created = process.create_time()
    except Exception:  # NoSuchProcess, AccessDenied, or psutil missing
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return created <= float(launch.get("t", created)) + 1.0


def launcher_of(run_dir: Path, events: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """`launcher_pid`, `launcher_host` and `t` (when it started, at the latest)
    from the first launch event, else from launcher.pid (a detached launcher
    still reaching its hosts)."""
    if events is None:
        events = read_events(run_dir / EVENTS)
    launch = next((e for e in events if e.get("event") == "launch"), None)
    if launch is not None and isinstance(launch.get("launcher_pid"), int):
        return launch
    return read_launcher_pid(run_dir)


def read_run(run_dir: str | os.PathLike,
             alive: Callable[[dict[str, Any]], bool | None] = launcher_alive) -> RunFiles:
    """The run directory's files, finished or not (raises RunDirError when it
    is none); `alive` asked only of a run without summary.json."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir}: no such directory")
    detached = read_launcher_pid(run_dir)
    events_path = run_dir / EVENTS
    if not events_path.exists() and not (run_dir / SUMMARY).exists() and not detached:
        raise RunDirError(f"{run_dir}: not a run directory (no events.jsonl or summary.json)")
    events = read_events(events_path)
    summary = read_json(run_dir / SUMMARY)
    verdict = None
    if summary is None:
        launch = next((e for e in events if e.get("event") == "launch"), None) or detached
        verdict = alive(launch) if launch else None
    out = run_dir / LAUNCHER_OUT
    try:
        logs = frozenset(os.listdir(run_dir / LOGS))
    except OSError:
        logs = frozenset()
    return RunFiles(run_dir=run_dir, config=read_config(run_dir / CONFIG), events=events,
                    summary=summary, detached=detached, launcher_alive=verdict,
                    launcher_out=out if out.exists() else None, logs=logs,
                    summary_written=summary is not None or (run_dir / SUMMARY).exists())


def load_run(run_dir: str | os.PathLike,
             alive: Callable[[dict[str, Any]], bool | None] = launcher_alive,
             now: float | None = None) -> RunView:
    """A run directory read and folded into its view (`now`: the moment a
    running job is seen at, for its goodput so far; the clock's when None)."""
    return run_view(read_run(run_dir, alive), now=now)
