"""Traces of this host's tasks, on request (`profile`).

The launcher asks every task of a job to trace at the same moment
(launcher/job/run/profiling.py). For each task named, this part writes a request
file (0600, replaced atomically) where the task's runtime looks for it
(`MGPU_PROFILE_REQUEST`, launcher/runtime/trace.py): the trace's id, its
length, where to write it, and when to start, `delay_s` from now by this
host's clock (so the hosts start together whatever the launcher's latency to
each). The task answers on its progress channel with `{"profile": {...}}`;
`answered` takes that record out of the progress stream and sends the trace
file in `profile_part` events (base64, PART_BYTES each: a line stays well
under the launcher's 4 MiB bound), then one `profile` event with the summary.
A task not running here is answered at once with an error.

Standard library only; of the launcher, imports the agent's files.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time

from launcher.agent.files import private_dir, write_private

PROFILES = "profiles"
REQUEST_ENV = "MGPU_PROFILE_REQUEST"  # launcher/runtime/trace.py reads it
PART_BYTES = 2**20
MAX_FILE_BYTES = 256 * 2**20  # a trace larger than this is summarised, not sent
TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def request_path(run_dir: str, task: str) -> str:
    """Where `task` looks for its trace requests (its MGPU_PROFILE_REQUEST)."""
    return os.path.join(private_dir(run_dir, PROFILES), f"{task}.request")


def nan_path(request: str) -> str:
    """Where the drill's NaN for the task of `request` goes (runtime/trace.py's)."""
    return request.removesuffix(".request") + ".nan"


def clear_requests(run_dir: str, task: str) -> None:
    """A task starts with no request left for its name by an earlier generation."""
    path = request_path(run_dir, task)
    for stale in (path, nan_path(path)):
        try:
            os.unlink(stale)
        except OSError:
            pass


class Profiles:
    """Answers `profile` for running tasks (each with `name`, `generation`)."""

    def __init__(self, run_dir: str, emit) -> None:
        self.run_dir = run_dir
        self.emit = emit
        self._lock = threading.Lock()
        self._asked: dict[tuple[str, str], tuple[str, bool]] = {}  # (id, task) -> folder, send

    def request(self, tasks: list, names: list[str] | None, message: dict) -> None:
        """Ask `tasks` (those of `names` that run; None: all) to trace."""
        ident = message.get("id")
        if not isinstance(ident, str) or not TRACE_ID.match(ident):
            raise ValueError(f"bad trace id {str(ident)[:80]!r}")
        seconds = float(message.get("seconds", 2.0))
        start_at = time.time() + max(float(message.get("delay_s", 1.0)), 0.0)
        send = message.get("send_file", True) is not False
        running = {t.name for t in tasks}
        for name in names or []:
            if name not in running:
                self.emit("profile", id=ident, task=name[:200], generation=None,
                          error="no such task running on this host")
        for task in tasks:
            folder = private_dir(self.run_dir, PROFILES, ident, task.name)
            with self._lock:
                self._asked[(ident, task.name)] = (folder, send)
            path = request_path(self.run_dir, task.name)
            write_private(path + ".tmp", json.dumps({
                "id": ident, "seconds": seconds, "start_at": start_at, "logdir": folder}))
            os.replace(path + ".tmp", path)

    def poison(self, tasks: list, name: str, within_s: float) -> None:
        """The drill's NaN for `name` (running here), in its own file: taken
        within `within_s`, its weights go NaN at its next step
        (launcher/runtime/trace.py, sentinel.py); later, it is dropped."""
        if name not in {t.name for t in tasks}:
            self.emit("log", text=f"drill: no task {name[:200]!r} running here for the NaN")
            return
        path = nan_path(request_path(self.run_dir, name))
        write_private(path + ".tmp", json.dumps({"until": time.time() + within_s}))
        os.replace(path + ".tmp", path)

    def answered(self, task, record: object) -> None:
        """A task's `{"profile": record}` from its progress channel."""
        if not isinstance(record, dict):
            return
        ident = str(record.get("id", ""))
        with self._lock:
            asked = self._asked.pop((ident, task.name), None)
        if asked is None:
            return  # not asked by this agent (or asked twice): nothing to send
        folder, send = asked
        error = str(record.get("error") or "")[:2000]
        path = record.get("file")
        size = 0
        if send and not error and isinstance(path, str):
            size, error = self._send_file(task, ident, folder, path)
        summary = record.get("summary") if isinstance(record.get("summary"), dict) else None
        self.emit("profile", id=ident, task=task.name, generation=task.generation,
                  summary=summary, started=record.get("started"), file_bytes=size,
                  error=error)

    def _send_file(self, task, ident: str, folder: str, path: str) -> tuple[int, str]:
        """The trace file in parts; (bytes sent, error)."""
        real = os.path.realpath(path)
        if not real.startswith(os.path.realpath(folder) + os.sep):
            return 0, "the trace file is outside its folder"
        try:
            size = os.path.getsize(real)
            if size > MAX_FILE_BYTES:
                return 0, f"the trace file has {size} bytes (more than {MAX_FILE_BYTES}): " \
                          f"left on the host at {real}"
            import base64  # here: every agent imports this module at its start

            with open(real, "rb") as handle:
                offset = 0
                while chunk := handle.read(PART_BYTES):
                    self.emit("profile_part", id=ident, task=task.name,
                              generation=task.generation, offset=offset,
                              data=base64.b64encode(chunk).decode("ascii"))
                    offset += len(chunk)
        except OSError as exc:
            return 0, f"the trace file could not be read: {exc}"
        return offset, ""
