"""Notifications: `notify: {command, events, timeout_s}` of the cluster file
runs `command` on the launcher's machine when the job fails, restarts,
succeeds, is stopped or names a straggler (docs/operations.md, "Notifications").

The command runs through `sh -c` in its own process group, with the event as
one JSON line on stdin (its events.jsonl line plus `notify`, `job`, `run_dir`)
and MGPU_EVENT, MGPU_JOB, MGPU_RUN_DIR in its environment. The supervisor
thread only queues (a bounded queue: past `QUEUE_MAX` waiting, a notification
is dropped and counted); one thread of the notifier's own runs the commands in
order, each killed (its whole group) after `timeout_s`. A command that fails,
times out or cannot start is recorded as a `notify_failed` event, never fatal.
When the job ends, the notifier waits at most `timeout_s` + `CLOSE_SLACK_S` for
what is queued (the job's last word is the notification people wait for).

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..job import events as ev
from ..spec.outlets import NotifySettings
from .runstate import is_straggler

QUEUE_MAX = 100
CLOSE_SLACK_S = 5.0
_JOB_END = {"succeeded": "succeeded", "failed": "failed", "interrupted": "stopped"}
_STOP = object()


def notification(event: ev.Event) -> str | None:
    """The notification an event is (failed, restarted, ...), or None."""
    if isinstance(event, ev.JobDone):
        return _JOB_END.get(event.status, "failed")
    if isinstance(event, ev.Restart):
        return "restarted"
    if is_straggler(event):
        return "straggler"
    return None


class Notifier:
    """A view of the launch (`open`, `tell`, `close`) that runs the command."""

    def __init__(self, settings: NotifySettings, job: str, run_dir: Path,
                 cwd: str | None = None) -> None:
        self.settings = settings
        self.job = job
        self.run_dir = Path(run_dir)
        self._cwd = cwd
        self._queue: queue.Queue[Any] = queue.Queue(QUEUE_MAX)
        self._record: Callable[[ev.Event], None] = lambda _event: None
        self._thread: threading.Thread | None = None
        self.dropped = 0

    def open(self, record: Callable[[ev.Event], None]) -> None:
        self._record = record
        self._thread = threading.Thread(target=self._run_loop, name="notify", daemon=True)
        self._thread.start()

    def tell(self, event: ev.Event) -> None:
        """From the supervisor thread: queue, never wait."""
        name = notification(event)
        if name is None or name not in self.settings.events:
            return
        line = {**ev.to_record(event, event.t if event.t is not None else round(time.time(), 6)),
                **event.extra, "notify": name, "job": self.job, "run_dir": str(self.run_dir)}
        try:
            self._queue.put_nowait((name, json.dumps(line, default=str)))
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Let what is queued run (bounded), then stop."""
        if self._thread is None:
            return
        try:
            self._queue.put(_STOP, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(self.settings.timeout_s + CLOSE_SLACK_S)
        if self.dropped:
            self._record(ev.NotifyFailed(notify="*", reason=(
                f"{self.dropped} notification(s) dropped: more than {QUEUE_MAX} waited")))
        if self._thread.is_alive():
            self._record(ev.NotifyFailed(notify="*", reason=(
                "the launcher ended before every notification was sent")))

    # ------------------------------------------------------------ its thread

    def _run_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            name, line = item
            failure = self._run(name, line)
            if failure is not None:
                self._record(failure)

    def _run(self, name: str, line: str) -> ev.NotifyFailed | None:
        env = {**os.environ, "MGPU_EVENT": name, "MGPU_JOB": self.job,
               "MGPU_RUN_DIR": str(self.run_dir)}
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", self.settings.command],
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, env=env, cwd=self._cwd,
                                    start_new_session=True)
        except OSError as exc:
            return ev.NotifyFailed(notify=name, reason=f"cannot run the command: {exc}")
        try:
            _, err = proc.communicate((line + "\n").encode(), timeout=self.settings.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return ev.NotifyFailed(notify=name, reason=(
                f"the command ran past notify.timeout_s ({self.settings.timeout_s:g} s): "
                "killed"))
        if proc.returncode != 0:
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
            said = f": {last[0][:200]}" if last else ""
            return ev.NotifyFailed(notify=name, exit_code=proc.returncode,
                                   reason=f"the command exited with {proc.returncode}{said}")
        return None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=CLOSE_SLACK_S)
    except subprocess.TimeoutExpired:  # a grandchild of its own session holds the pipe
        pass
