"""Notifications run: `notify: {command, events, timeout_s}` of the cluster
file runs `command` on the launcher's machine when the job fails, restarts,
succeeds, is stopped, names a straggler or its loss goes non-finite
(docs/operations.md, "Notifications"; which events are notifications, and
their JSON line, are launcher/views/notify.py's).

The command runs through `sh -c` in its own process group, with the event as
one JSON line on stdin (its events.jsonl line plus `notify`, `job`, `run_dir`)
and MGPU_EVENT, MGPU_JOB, MGPU_RUN_DIR in its environment. The supervisor
thread only queues (a bounded queue: past `QUEUE_MAX` waiting, a notification
is dropped and counted); one thread of the notifier's own runs the commands in
order, each killed (its whole group) after `timeout_s`. A command that fails,
times out or cannot start is recorded as a `notify_failed` event, never fatal.
When the job ends, the command running then keeps its `timeout_s`, and of those
still queued only the newest runs (the job's end, the notification people wait
for), with its own `timeout_s`; the others are recorded as not run. Nothing the
notifier started outlives the launcher: `close` waits at most twice
(`timeout_s` + `CLOSE_SLACK_S`), then kills what still runs, group and all.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..job.record import events as ev
from ..spec.outlets import NotifySettings
from ..views.notify import notification, notification_line

QUEUE_MAX = 100
CLOSE_SLACK_S = 5.0


class Notifier:
    """A view of the launch (`open`, `tell`, `close`) that runs the command."""

    def __init__(self, settings: NotifySettings, job: str, run_dir: Path,
                 cwd: str | None = None) -> None:
        self.settings = settings
        self.job = job
        self.run_dir = Path(run_dir)
        self._cwd = cwd
        self._queue: queue.Queue[tuple[str, str]] = queue.Queue(QUEUE_MAX)
        self._record: Callable[[ev.Event], None] = lambda _event: None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._running: tuple[str, subprocess.Popen, float] | None = None  # name, proc, start
        self.dropped = 0
        self._dropped_names: set[str] = set()

    def open(self, record: Callable[[ev.Event], None]) -> None:
        self._record = record
        self._thread = threading.Thread(target=self._run_loop, name="notify", daemon=True)
        self._thread.start()

    def tell(self, event: ev.Event) -> None:
        """From the supervisor thread: queue, never wait."""
        name = notification(event)
        if name is None or name not in self.settings.events:
            return
        line = notification_line(event, name, self.job, self.run_dir, round(time.time(), 6))
        try:
            self._queue.put_nowait((name, line))
        except queue.Full:
            self.dropped += 1
            self._dropped_names.add(name)

    def close(self) -> None:
        """Let the running command and the newest queued one run (each bounded
        by timeout_s), then stop; what still runs past that is killed."""
        if self._thread is None:
            return
        self._closing.set()
        self._thread.join(2 * (self.settings.timeout_s + CLOSE_SLACK_S))
        if self.dropped:
            names = ", ".join(sorted(self._dropped_names))
            self._record(ev.NotifyFailed(notify=names, reason=(
                f"{self.dropped} notification(s) not run: more than {QUEUE_MAX} waited")))
        if self._thread.is_alive():  # e.g. a command whose pipe a grandchild holds
            with self._lock:
                running = self._running
            if running is not None:
                name, proc, started = running
                _kill_group(proc, wait_s=1.0)
                self._record(ev.NotifyFailed(notify=name, reason=(
                    f"killed after {time.monotonic() - started:.0f} s: the launcher was "
                    "ending and could wait no longer")))

    # ------------------------------------------------------------ its thread

    def _run_loop(self) -> None:
        while True:
            try:
                name, line = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if self._closing.is_set() and not self._queue.empty():
                self._record(ev.NotifyFailed(notify=name, reason=(
                    "not run: the job ended while it waited its turn (then only the "
                    "newest notification runs)")))
                continue
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
        with self._lock:
            self._running = (name, proc, time.monotonic())
        try:
            _, err = proc.communicate((line + "\n").encode(), timeout=self.settings.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return ev.NotifyFailed(notify=name, reason=(
                f"the command ran past notify.timeout_s ({self.settings.timeout_s:g} s): "
                "killed"))
        finally:
            with self._lock:
                self._running = None
        if proc.returncode != 0:
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
            said = f": {last[0][:200]}" if last else ""
            return ev.NotifyFailed(notify=name, exit_code=proc.returncode,
                                   reason=f"the command exited with {proc.returncode}{said}")
        return None


def _kill_group(proc: subprocess.Popen, wait_s: float = CLOSE_SLACK_S) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        proc.communicate(timeout=wait_s)
    except (subprocess.TimeoutExpired, ValueError):  # a grandchild of its own session
        pass  # holds the pipe (ValueError: the notifier's thread reads it meanwhile)
