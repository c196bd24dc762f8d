"""A run's tasks replayed from events.jsonl, as `status` shows a run still going
(or one whose launcher died before writing summary.json).

The task states come from the supervisor's own state machine
(`launcher.job.states.apply`) over the typed events (`launcher.job.events`),
so the replay cannot tell another story than the run did. Lines of any schema
version are read (version 1 had no `v`, no `teardown_begun`, no
`start_failed`: the same machine reads them as before).

Read-only, pure over the events given. Must not import supervisor, transport
or cli.
"""

from __future__ import annotations

import re
import signal as signals
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..job import events as ev
from ..job.states import TaskState, apply
from ..spec.plan import task_label

_TASK_NAME = re.compile(r"^(chief|worker|ps|evaluator)(\d+)$")


@dataclass
class TaskView:
    """One task as last recorded: its latest generation wins."""

    label: str  # host0/worker0
    host: str
    role: str
    index: int
    generation: int
    state: str = "pending"
    address: str | None = None
    port: int | None = None
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    last_step: int | None = None
    last_progress: dict[str, Any] = field(default_factory=dict)
    last_progress_t: float | None = None
    log_path: Path | None = None
    lifetime: str = "job"  # "service": a task the launcher stops (ps)

    @property
    def name(self) -> str:
        return f"{self.role}{self.index}"

    def exit_text(self) -> str:
        if self.signal is not None:
            try:
                return f"signal {self.signal} ({signals.Signals(self.signal).name})"
            except ValueError:
                return f"signal {self.signal}"
        return "" if self.exit_code is None else str(self.exit_code)


def split_name(task: str) -> tuple[str, int]:
    match = _TASK_NAME.match(task)
    if match is None:
        return task, 0
    return match.group(1), int(match.group(2))


@dataclass
class Replayed:
    """What events.jsonl says, read from the start."""

    tasks: dict[str, TaskView] = field(default_factory=dict)  # by name: unique per generation
    generation: int = 0
    restarts: int = 0
    first_launch: dict[str, Any] | None = None
    failures: dict[int, ev.FailureDetected] = field(default_factory=dict)  # first per generation


def replay(records: list[dict[str, Any]]) -> Replayed:
    replayed = Replayed()
    for record in records:
        feed(replayed, ev.from_record(record), record)
    return replayed


def feed(replayed: Replayed, event: ev.Event, record: dict[str, Any]) -> None:
    """One more event (and its line) of the story, as `replay` reads each."""
    if isinstance(event, ev.Launch):
        _on_launch(replayed, event, record)
        return
    if isinstance(event, ev.Restart):
        replayed.restarts = event.restarts or replayed.restarts + 1
    elif isinstance(event, ev.FailureDetected):
        replayed.failures.setdefault(event.generation, event)
    generation = getattr(event, "generation", replayed.generation)
    if isinstance(event, ev.TaskEvent):
        view = replayed.tasks.get(event.task)
        views = [view] if view is not None else []
    else:
        views = list(replayed.tasks.values())
    for view in views:
        if view.generation == generation:
            _on_event(view, event)


def _on_launch(replayed: Replayed, event: ev.Launch, record: dict[str, Any]) -> None:
    replayed.generation = event.generation
    replayed.first_launch = replayed.first_launch or record
    for placed in event.tasks:
        if not isinstance(placed, ev.Placed):
            continue
        role, index = split_name(placed.task)
        previous = replayed.tasks.get(placed.task)
        view = TaskView(label=task_label(placed.host, placed.task), host=placed.host,
                        role=role, index=index, generation=event.generation,
                        address=placed.address, port=placed.port, lifetime=placed.lifetime)
        if previous is not None:  # progress survives a restart: training resumes
            view.last_step, view.last_progress = previous.last_step, previous.last_progress
        replayed.tasks[placed.task] = view


def _on_event(view: TaskView, event: ev.Event) -> None:
    """What `event` tells of the task `view`: its data, then its state."""
    if isinstance(event, ev.TaskStarted):
        view.pid = event.pid
    elif isinstance(event, ev.Progress):
        view.last_step = event.metrics.get("step", view.last_step)
        view.last_progress = dict(event.metrics)
        view.last_progress_t = event.t
    elif isinstance(event, ev.TaskExited):
        view.exit_code, view.signal = event.exit_code, event.signal
    elif isinstance(event, ev.TaskRestarted):  # a parameter-server worker, restarted alone
        view.exit_code, view.signal = None, None
    try:
        state = TaskState(view.state)
    except ValueError:
        return
    view.state = apply(state, event, host=view.host, lifetime=view.lifetime).value


def failure_from_event(event: ev.FailureDetected) -> dict[str, Any]:
    """A failure as summary.json lists it, from its `failure_detected` event."""
    task = task_label(event.host, event.task)
    kind = event.failure
    if event.reason:
        what = str(event.reason)
    elif kind == "signal":
        what = f"was killed by signal {event.signal}"
    elif kind == "exit":
        what = f"exited with code {event.exit_code}"
    else:
        what = str(kind)
    return {"task": task, "host": event.host, "generation": event.generation,
            "t": event.t, "kind": kind, "exit_code": event.exit_code,
            "signal": event.signal,
            "description": f"{task} (host {event.host}, generation "
                           f"{event.generation}) {what}"}
