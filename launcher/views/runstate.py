"""A run as the views away from the terminal see it, kept up event by event:
the Prometheus metrics (launcher/views/metrics.py) while the launcher runs, and
`status RUN_DIR --watch` (launcher/views/status_watch.py) from events.jsonl.

Built on `replay` (the supervisor's own task state machine over the typed
events), plus what a view needs beside it: the job's state, each task's
steps/s (from its last two progress reports), the stragglers named, the
goodput parts. `straggler` events are read by their kind and fields (task,
host, slowdown, evidence), typed or not; the goodput parts are set by
`set_goodput`, or by a `goodput` event whose fields (or `goodput` field) hold
`parts` (and `wall_s`, `productive_s`), as summary.json's `goodput` does.

Not thread-safe by itself (its users lock). Must not import supervisor,
transport or cli.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..job import events as ev
from ..job.states import TaskRow
from .replay import Replayed, feed

# The job's state as the metrics say it (one of these is 1 at a time).
JOB_STATES = ("starting", "running", "failing", "stopping", "waiting_for_host",
              "restarting", "succeeded", "failed", "interrupted")
# Task states whose rate and silence no longer mean anything.
_OVER = ("succeeded", "failed", "stopped", "lost")


@dataclass(frozen=True)
class Straggler:
    task: str
    host: str
    slowdown: float | None
    evidence: Any
    generation: int


@dataclass
class RunState:
    """The story so far (feed it every event, in order)."""

    replayed: Replayed = field(default_factory=Replayed)
    job_state: str = "starting"
    marks: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (t, step)
    task_started_t: dict[str, float] = field(default_factory=dict)  # this generation's start
    stragglers: dict[str, Straggler] = field(default_factory=dict)  # by task, this generation
    straggler_reports: int = 0
    goodput: dict[str, float] = field(default_factory=dict)  # part -> seconds
    goodput_wall_s: float | None = None
    goodput_productive_s: float | None = None
    ended: ev.JobDone | None = None
    started_t: float | None = None

    def tell(self, event: ev.Event, now: float | None = None) -> None:
        """`event` as it happens (a live event has no `t` yet: `now` is its time)."""
        if event.t is None:
            event = dataclasses.replace(event, t=time.time() if now is None else now)
        if self.started_t is None:
            self.started_t = event.t
        feed(self.replayed, event, ev.to_record(event, event.t or 0.0))
        if is_straggler(event):
            self._straggler(event)
        elif kind_of(event) == "goodput":  # the ledger told as an event: its fields
            values = {**event.extra, **ev.fields_of(event)}
            ledger = values["goodput"] if isinstance(values.get("goodput"), dict) else values
            if isinstance(ledger.get("parts"), dict):
                self.set_goodput(ledger["parts"], _seconds(ledger.get("wall_s")),
                                 _seconds(ledger.get("productive_s")))
        elif isinstance(event, ev.Progress):
            self._progress(event)
        elif isinstance(event, ev.TaskStarted):
            self.task_started_t[event.task] = float(event.t or 0.0)
        elif isinstance(event, ev.Launch):
            self.stragglers.clear()
            self.task_started_t.clear()
            self.job_state = "starting"
        elif isinstance(event, ev.JobDone):
            self.ended = event
            self.job_state = event.status if event.status in JOB_STATES else "failed"
        if self.ended is None:
            self._move(event)

    def _move(self, event: ev.Event) -> None:
        moves = {ev.FailureDetected: "failing", ev.StopRequested: "stopping",
                 ev.HostWait: "waiting_for_host", ev.HostLost: "failing",
                 ev.Restart: "restarting"}
        for kind, state in moves.items():
            if isinstance(event, kind):
                self.job_state = state
                return
        if self.job_state == "starting" and self.replayed.tasks and all(
                t.state in ("running", "succeeded") for t in self.replayed.tasks.values()):
            self.job_state = "running"

    def _progress(self, event: ev.Progress) -> None:
        step = event.metrics.get("step")
        if not _number(step):
            return
        marks = self.marks.setdefault(event.task, [])
        if marks and (step < marks[-1][1]):  # a restart resumed earlier: start again
            marks.clear()
        marks.append((float(event.t or 0.0), float(step)))
        del marks[:-2]

    def _straggler(self, event: ev.Event) -> None:
        values = {**event.extra, **ev.fields_of(event)}
        slowdown = values.get("slowdown")
        task = str(values.get("task", ""))
        self.straggler_reports += 1
        self.stragglers[task] = Straggler(
            task=task, host=str(values.get("host", "")),
            slowdown=float(slowdown) if _number(slowdown) else None,
            evidence=values.get("evidence"),
            generation=int(values.get("generation") or self.replayed.generation))

    def set_goodput(self, parts: Mapping[str, float], wall_s: float | None = None,
                    productive_s: float | None = None) -> None:
        """The goodput ledger's parts, in seconds (summary.json's `goodput.parts`)."""
        self.goodput = {str(k): float(v) for k, v in parts.items() if _number(v)}
        self.goodput_wall_s = wall_s
        self.goodput_productive_s = productive_s

    # ------------------------------------------------------------- reading

    def rate(self, task: str) -> float | None:
        marks = self.marks.get(task, [])
        if len(marks) < 2 or marks[1][0] <= marks[0][0]:
            return None
        return (marks[1][1] - marks[0][1]) / (marks[1][0] - marks[0][0])

    def rows(self, now: float) -> list[TaskRow]:
        """The live table's rows (no CPU or memory: the run directory has none).
        `silent_s`: since the task's last progress report, or its start before one."""
        out = []
        for name, view in self.replayed.tasks.items():
            over = view.state in _OVER
            loss = view.last_progress.get("loss")
            since = view.last_progress_t or self.task_started_t.get(name)
            out.append(TaskRow(
                label=view.label, host=view.host, task=name, state=view.state,
                generation=view.generation, restarts=self.replayed.restarts,
                step=view.last_step if _number(view.last_step) else None,
                steps_per_s=None if over else self.rate(name),
                loss=loss if _number(loss) else None, cpu_percent=None, rss_mb=None,
                silent_s=None if over or since is None else max(0.0, now - since)))
        return out


def is_straggler(event: ev.Event) -> bool:
    """A `straggler` event, typed (launcher.job.events) or read back as Unknown."""
    return kind_of(event) == "straggler"


def kind_of(event: ev.Event) -> str:
    """An event's kind, typed or read back as Unknown."""
    return event.name if isinstance(event, ev.Unknown) else event.kind


def _seconds(value: Any) -> float | None:
    return float(value) if _number(value) else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
