"""The run as one model: the story (the typed events of launcher/job/record/events.py)
folded, one event at a time, into what every view shows.

`Story.tell(event)` folds one event (the metrics, the live title and
`status --watch` tell each as it comes); `fold(records)` folds the lines of
events.jsonl whole (`status`, `status --json`, the report, the drill). What it
keeps: the job's phase (`JOB_STATES`, as the launcher told it: `job_phase`,
then `job_done`), the generation, every task of the latest generation with
its state (`states.apply`, the supervisor's own state machine, from
`task_starting` on: the story cannot be told otherwise), pid, exit, step,
steps/s, last report; the failures (the first of each generation, and the task a later
`root_cause` blamed), the restarts, the resumes, the goodput ledger
(`goodput.Ledger`), the stragglers, the out-of-step warnings and tail cuts;
the training's history (`history.History`: each generation's steps, first
step, resume point, the saves and each task's exit, which the drill judges).
A new fact a view shows is a field of an event, a line of `tell` and the
view's own line (docs/design.md, "A new field in every view").

Each event costs O(1) (an event of a whole generation: its tasks): the
supervisor thread tells the metrics every event. Not thread-safe by itself
(its users lock). Pure: no I/O, no clock but the `now` handed in. Must not
import supervisor, transport, ops or cli.
"""

from __future__ import annotations

import dataclasses
import json
import re
import signal as signals
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...spec.plan import task_label
from . import eventlines
from . import events as ev
from .failkinds import Kind
from .goodput import Ledger
from .history import History
from .reports import ProgressReport
from .states import Failure, TaskState, apply, reason_of
from .timeline import JOB_ROW, Timeline, activity

# The job's state as the views say it (the metrics: one of these is 1 at a time).
JOB_STATES = ("starting", "running", "failing", "stopping", "waiting_for_host",
              "restarting", "succeeded", "failed", "interrupted")
# Task states whose rate and silence no longer mean anything.
OVER = ("succeeded", "failed", "stopped", "lost")
# A straggler as summary.json lists it (job/detect/radar.py names them so).
_NAMED = ("generation", "task", "host", "slowdown", "evidence", "source", "action")
_TASK_NAME = re.compile(r"^(chief|worker|ps|evaluator)(\d+)$")


@dataclass(frozen=True)
class Beside:
    """What the supervisor alone knows of a task of the generation it runs
    (job/detect/generation.py), shown beside the model's row in the launcher's own
    table: no event says it."""

    label: str  # host0/worker0
    generation: int
    cpu_percent: float | None
    rss_mb: float | None
    silent_s: float | None  # seconds since the last output line or progress report


@dataclass(frozen=True)
class TaskRow:
    """One line of the live table (a snapshot, safe to hand to a view): a task of
    the model (`Story.rows`), with what the supervisor alone knows of it beside
    (`Beside`: CPU, memory, the silence since its last output line)."""

    label: str  # host0/worker0
    host: str
    task: str  # worker0
    state: str
    generation: int
    restarts: int
    step: int | None
    steps_per_s: float | None
    loss: float | None
    cpu_percent: float | None
    rss_mb: float | None
    silent_s: float | None  # seconds since the last output line or progress report
    slowdown: float | None = None  # a straggler: how much slower than its peers


@dataclass
class TaskView:
    """One task as last told: its latest generation wins."""

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
    reported: dict[str, Any] = field(default_factory=dict)  # this generation's last report
    started_t: float | None = None  # this generation's start of it
    marks: list[tuple[float, float]] = field(default_factory=list)  # last two (t, step)
    log_path: Path | None = None  # set by the reader of a run directory
    lifetime: str = "job"  # "service": a task the launcher stops (ps)
    over: bool = False  # its program ended cleanly while the job ran (program_over)
    start: str | None = None  # cold | warm (a standby took it: launcher/standby.py)
    restarted_alone: int = 0  # times restarted alone in its generation (ParameterServerStrategy)
    # What its timeline span says (job/record/timeline.py): its cluster (joining, joined),
    # a report told in this generation, its generation's failure its own, its end told.
    cluster: str = ""
    trained: bool = False
    failed: bool = False
    gone: bool = False

    @property
    def final_state(self) -> str:
        """Its state as the job's end says it: a program that ended cleanly
        succeeded, even when the launcher ended its interpreter's teardown
        (job/detect/tailcut.py), as summary.json says it (states.final_state)."""
        return "succeeded" if self.over and self.state == "stopped" else self.state

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

    @property
    def steps_per_s(self) -> float | None:
        return None if self.state in OVER else steps_per_s(self.marks)


@dataclass(frozen=True)
class Straggler:
    task: str
    host: str
    slowdown: float | None
    evidence: Any
    generation: int


@dataclass
class Story:
    """The story so far (tell it every event, in order)."""

    tasks: dict[str, TaskView] = field(default_factory=dict)  # by name: unique per generation
    generation: int = 0
    restarts: int = 0
    rollbacks: int = 0  # restarts after a loss gone bad (the NaN sentinel's)
    job_state: str = "starting"  # as the last `job_phase` said it, then `job_done`
    first_launch: dict[str, Any] | None = None  # generation 0's launch line (launcher pid...)
    launch: ev.Launch | None = None  # the first launch that names its command and hosts
    failures: dict[int, ev.FailureDetected] = field(default_factory=dict)  # first per generation
    blamed: dict[int, ev.RootCause] = field(default_factory=dict)  # a later root cause
    causes: dict[int, dict[str, Any]] = field(default_factory=dict)  # root cause, summary's form
    settled: set[int] = field(default_factory=set)  # generations failing, stopping or torn down
    untimed: set[int] = field(default_factory=set)  # causes told without `at`: t is when told
    resumes: list[ev.Resumed] = field(default_factory=list)
    alone: list[ev.TaskRestarted] = field(default_factory=list)  # PS workers restarted alone
    resume_behind: list[ev.ResumeBehind] = field(default_factory=list)
    passed_over: list[ev.CheckpointPassedOver] = field(default_factory=list)  # unreadable
    # The NaN sentinel's: a loss, a save gone NaN, a loss spike, a bad batch skipped
    # (job/detect/sentinel.py).
    nonfinite: list[ev.Event] = field(default_factory=list)
    stragglers: dict[str, Straggler] = field(default_factory=dict)  # by task, this generation
    straggler_events: list[ev.Event] = field(default_factory=list)  # every one, in order
    out_of_step: list[ev.OutOfStepAhead] = field(default_factory=list)
    tail_cuts: list[ev.TailCut] = field(default_factory=list)
    keras_switched: ev.KerasSwitched | None = None
    timeline: Timeline = field(default_factory=Timeline)  # each task's activity over time
    placed: dict[str, list[str]] = field(default_factory=dict)  # task -> hosts it ran on
    ledger: Ledger = field(default_factory=Ledger)  # where the time went (job/record/goodput.py)
    given_goodput: dict[str, Any] | None = None  # a ledger told whole (a `goodput` event)
    metrics_url: str | None = None
    ended: ev.JobDone | None = None
    started_t: float | None = None  # the first event's time
    last_t: float | None = None  # the last event's time
    events: int = 0
    # The training's steps, saves, resume points and exits (job/record/history.py).
    history: History = field(default_factory=History)

    def tell(self, event: ev.Event, now: float | None = None) -> None:
        """`event` as it happens (a live event has no `t` yet: `now` is its time)."""
        if event.t is None and now is not None:
            event = dataclasses.replace(event, t=now)
        self.events += 1
        if event.t is not None:
            self.started_t = event.t if self.started_t is None else self.started_t
            self.last_t = event.t
        self.ledger.add(event)
        self.history.tell(event)
        teller = _TELLERS.get(type(event))
        if teller is not None:
            teller(self, event)
        elif kind_of(event) == "straggler":  # read back by its kind (an older line)
            self._straggler(event)
        elif kind_of(event) == "goodput":
            self._goodput(event)
        self._tasks(event)

    # ---------------------------------------------------------- the tellers

    def _launch(self, event: ev.Launch) -> None:
        self.generation = event.generation
        if self.first_launch is None:
            self.first_launch = {"t": event.t, **ev.fields_of(event), **event.extra}
        if self.launch is None and event.command is not None:
            self.launch = event
        self.stragglers.clear()
        self.timeline.switch(event.generation, JOB_ROW, None, event.t or 0.0)  # restarted
        for placed in event.tasks:
            if not isinstance(placed, ev.Placed):
                continue
            hosts = self.placed.setdefault(placed.task, [])
            hosts += [] if placed.host in hosts else [placed.host]
            self.timeline.switch(event.generation, placed.task, "starting", event.t or 0.0,
                                 placed.host)
            role, index = split_name(placed.task)
            previous = self.tasks.get(placed.task)
            view = TaskView(label=task_label(placed.host, placed.task), host=placed.host,
                            role=role, index=index, generation=event.generation,
                            address=placed.address, port=placed.port, lifetime=placed.lifetime)
            if previous is not None:  # progress survives a restart: training resumes
                # (its rate does not: two reports of this generation make it)
                view.last_step, view.last_progress = previous.last_step, previous.last_progress
            self.tasks[placed.task] = view

    def _restart(self, event: ev.Restart) -> None:
        self.restarts = event.restarts or self.restarts + 1
        failed = self.failures.get(event.generation - 1)
        if failed is not None and failed.failure == Kind.NONFINITE:
            self.rollbacks += 1  # to the last save before the bad step (job/detect/sentinel.py)
        if failed is not None:  # the job's row: from the fault to the next launch
            self.timeline.switch(event.generation, JOB_ROW, "restarting", failed.t or 0.0)

    def _failure(self, event: ev.FailureDetected) -> None:
        if event.generation not in self.failures:
            view = self.tasks.get(event.task)
            if view is not None and view.generation == event.generation:
                view.failed = True  # its span turns red (unless it has exited already)
        self.failures.setdefault(event.generation, event)
        if event.generation not in self.causes:
            self._cause(event)
        self.settled.add(event.generation)

    def _cause(self, event: ev.FailureDetected | ev.RootCause) -> None:
        self.causes[event.generation] = failure_json(event)
        if event.at is None:
            self.untimed.add(event.generation)
        else:
            self.untimed.discard(event.generation)

    def _root_cause(self, event: ev.RootCause) -> None:
        self.blamed[event.generation] = event
        self._cause(event)

    def _stacks(self, event: ev.Stacks) -> None:
        cause = self.causes.get(event.generation)
        if event.frames and cause is not None and cause["task"] == event.label:
            cause["stack"] = list(event.frames)

    def _program_over(self, event: ev.ProgramOver) -> None:
        view = self.tasks.get(event.task)
        if view is not None and view.generation == event.generation \
                and event.generation not in self.settled:
            view.over = True

    def _phase(self, event: ev.JobPhase) -> None:
        if self.ended is None and event.phase in JOB_STATES:
            self.job_state = event.phase

    def _done(self, event: ev.JobDone) -> None:
        self.ended = event
        self.job_state = event.status if event.status in JOB_STATES else "failed"

    def _metrics(self, event: ev.MetricsServed) -> None:
        self.metrics_url = self.metrics_url or event.url

    def _straggler(self, event: ev.Event) -> None:
        values = {**event.extra, **ev.fields_of(event)}
        slowdown = values.get("slowdown")
        task = str(values.get("task", ""))
        self.straggler_events.append(event)
        self.stragglers[task] = Straggler(
            task=task, host=str(values.get("host", "")),
            slowdown=float(slowdown) if _number(slowdown) else None,
            evidence=values.get("evidence"),
            generation=int(values.get("generation") or self.generation))

    def _goodput(self, event: ev.Event) -> None:
        """A ledger told whole: its fields (or its `goodput` field) hold `parts`."""
        values = {**event.extra, **ev.fields_of(event)}
        ledger = values["goodput"] if isinstance(values.get("goodput"), dict) else values
        if isinstance(ledger.get("parts"), dict):
            self.set_goodput(ledger["parts"], _seconds(ledger.get("wall_s")),
                             _seconds(ledger.get("productive_s")))

    def _tasks(self, event: ev.Event) -> None:
        """What `event` tells of the tasks of its generation: data, then state."""
        generation = getattr(event, "generation", self.generation)
        if isinstance(event, ev.TaskEvent):
            view = self.tasks.get(event.task)
            views = [view] if view is not None else []
        elif isinstance(event, ev.TeardownBegun | ev.HostLost):  # a generation's, a host's
            views = list(self.tasks.values())
        else:
            return
        t = event.t or 0.0
        for view in views:
            if view.generation != generation:
                continue
            _on_task(view, event)
            if isinstance(event, ev.TaskRestarted):  # it failed, and starts again at once
                self.timeline.switch(generation, view.name, "failed", t)
            self.timeline.switch(generation, view.name, activity(
                view.state, gone=view.gone, failed=view.failed, stepped=view.trained,
                cluster=view.cluster, service=view.lifetime == "service"), t)

    # ------------------------------------------------------------- reading

    def set_goodput(self, parts: Mapping[str, float], wall_s: float | None = None,
                    productive_s: float | None = None) -> None:
        """A ledger given whole (summary.json's `goodput`): it wins over the one kept."""
        self.given_goodput = {
            "wall_s": wall_s, "productive_s": productive_s,
            "parts": {str(k): float(v) for k, v in parts.items() if _number(v)}}

    def goodput(self, now: float | None = None) -> dict[str, Any] | None:
        """`{wall_s, productive_s, parts}` up to `now` (a finished job: to its end)."""
        return self.given_goodput or self.ledger.result(now)

    def failure_list(self) -> list[dict[str, Any]]:
        """Each generation's root cause (its first failure, unless a later
        `root_cause` named another task) and each worker restarted alone
        (`restarted_alone`), in time by generation, as summary.json lists them."""
        alone = [failure_json(event) for event in self.alone]
        return sorted([*(dict(cause) for cause in self.causes.values()), *alone],
                      key=lambda f: (f["generation"], _seconds(f["t"]) or 0.0))

    def root_cause(self) -> dict[str, Any] | None:
        """The failure that ended a failed job (summary.json's `root_cause`)."""
        failed = self.ended is not None and self.ended.status == "failed"
        return dict(self.causes[max(self.causes)]) if failed and self.causes else None

    def summary(self) -> dict[str, Any]:
        """summary.json of a finished job (its keys as states.RunResult.to_json
        always wrote them): the story's end, failures, tasks, resumes, stragglers."""
        done = self.ended or ev.JobDone(status="failed")
        switched = self.keras_switched
        return {
            "status": done.status, "restarts": done.restarts, "wall_s": done.wall_s,
            "root_cause": self.root_cause(), "message": done.message,
            "stopped_by": done.stopped_by or None, "interrupted_by": done.interrupted_by,
            "failures": self.failure_list(),
            "tasks": {view.label: {
                "host": view.host, "role": view.role, "index": view.index,
                "generation": view.generation, "state": view.final_state,
                "exit_code": view.exit_code, "signal": view.signal, "pid": view.pid,
                "last_progress": view.reported, "start": view.start}
                for view in self.tasks.values() if view.generation == self.generation},
            **({"keras_switched": ev.fields_of(switched)} if switched is not None else {}),
            "resumed": [ev.fields_of(e) for e in self.resumes],
            "stragglers": self.named(),
            # the NaN sentinel's (job/detect/sentinel.py): non-finite losses and saves
            # and the bad batches skipped, and apart, the finite spikes of a loss
            **_listed("nonfinite", [e for e in self.nonfinite if not isinstance(e, ev.LossSpike)]),
            **_listed("loss_spikes", [e for e in self.nonfinite if isinstance(e, ev.LossSpike)]),
        }

    def named(self) -> list[dict[str, Any]]:
        """Every straggler named, as summary.json lists them (job/detect/radar.py's `named`)."""
        return [{k: v for k, v in {**e.extra, **ev.fields_of(e)}.items() if k in _NAMED}
                for e in self.straggler_events]

    def faults(self) -> list[tuple[ev.FailureDetected, ev.FailureDetected | ev.RootCause]]:
        """Each generation's first failure and its root cause (a later `root_cause`
        event names another task: a hang blamed on its peer)."""
        return [(first, self.blamed.get(generation, first))
                for generation, first in sorted(self.failures.items())]

    def rows(self, now: float, beside: Sequence[Beside] = ()) -> list[TaskRow]:
        """The live table's rows: every task of the latest generation, as the model
        says it (the launcher's own table, `status --watch`, the metrics).
        `beside`: the supervisor's own figures of the generation it runs (the
        launcher's table): CPU, memory and the silence since a task's last output
        line, which no event says; without them, silent since its last report."""
        figures = {(b.label, b.generation): b for b in beside}
        rows = []
        for view in self.tasks.values():
            if view.generation != self.generation:
                continue  # a task of an earlier generation only (a host gone since)
            row, known = self._row(view, now), figures.get((view.label, view.generation))
            rows.append(row if known is None else dataclasses.replace(
                row, cpu_percent=known.cpu_percent, rss_mb=known.rss_mb,
                silent_s=known.silent_s))
        return rows

    def _row(self, view: TaskView, now: float) -> TaskRow:
        over = view.state in OVER
        loss = ProgressReport.read(view.last_progress).loss
        since = view.last_progress_t or view.started_t
        straggler = self.stragglers.get(view.name)
        return TaskRow(
            label=view.label, host=view.host, task=view.name, state=view.state,
            generation=view.generation, restarts=self.restarts,
            step=view.last_step if _number(view.last_step) else None,
            steps_per_s=view.steps_per_s,
            loss=loss if _number(loss) else None, cpu_percent=None, rss_mb=None,
            silent_s=None if over or since is None else max(0.0, now - since),
            slowdown=straggler.slowdown if straggler is not None else None)


_TELLERS: dict[type, Any] = {
    ev.Launch: Story._launch, ev.Restart: Story._restart, ev.FailureDetected: Story._failure,
    ev.RootCause: Story._root_cause, ev.JobDone: Story._done, ev.Stacks: Story._stacks,
    ev.ProgramOver: Story._program_over, ev.JobPhase: Story._phase,
    ev.StopRequested: lambda s, e: s.settled.add(e.generation),
    ev.TeardownBegun: lambda s, e: s.settled.add(e.generation),
    ev.MetricsServed: Story._metrics, ev.Straggler: Story._straggler,
    ev.Resumed: lambda s, e: s.resumes.append(e),
    ev.TaskRestarted: lambda s, e: s.alone.append(e),
    ev.ResumeBehind: lambda s, e: s.resume_behind.append(e),
    ev.CheckpointPassedOver: lambda s, e: s.passed_over.append(e),
    ev.Nonfinite: lambda s, e: s.nonfinite.append(e),
    ev.NonfiniteSave: lambda s, e: s.nonfinite.append(e),
    ev.LossSpike: lambda s, e: s.nonfinite.append(e),
    ev.BatchSkipped: lambda s, e: s.nonfinite.append(e),
    ev.ReplayPassed: lambda s, e: s.nonfinite.append(e),
    ev.BatchSkipDone: lambda s, e: s.nonfinite.append(e),
    ev.OutOfStepAhead: lambda s, e: s.out_of_step.append(e),
    ev.TailCut: lambda s, e: s.tail_cuts.append(e),
    ev.KerasSwitched: lambda s, e: setattr(s, "keras_switched", e),
}


def _listed(key: str, events: list[ev.Event]) -> dict[str, list[dict[str, Any]]]:
    """`{key: [each event's fields, its kind as `event`]}`, or nothing when none."""
    return {key: [{"event": e.kind, **ev.fields_of(e)} for e in events]} if events else {}


def _on_task(view: TaskView, event: ev.Event) -> None:
    """What `event` tells of the task `view`: its data, then its state."""
    if isinstance(event, ev.TaskStarted):
        view.pid, view.started_t, view.start = event.pid, event.t, event.start
    elif isinstance(event, ev.Progress):
        view.last_step = step_of(event.metrics, view.last_step)
        if ProgressReport.read(event.metrics).has_step or not view.reported:
            # a step's report; a save, a resume or a deleted backup alone is no step's
            view.last_progress = view.reported = dict(event.metrics)
        view.last_progress_t = event.t
        _mark(view, event)
        view.trained = True
    elif isinstance(event, ev.TaskExited):
        view.exit_code, view.signal = event.exit_code, event.signal
    elif isinstance(event, ev.TaskRestarted):  # a parameter-server worker, restarted alone
        view.exit_code, view.signal = None, None
        view.restarted_alone += 1
        view.failed, view.trained, view.cluster, view.gone = False, False, "", False
    elif isinstance(event, ev.Cluster):
        view.cluster = "joining" if event.state == "joining" else "joined"
    elif isinstance(event, ev.HostLost):
        view.failed = view.failed or event.host == view.host
    view.gone = view.gone or isinstance(event, ev.TaskExited | ev.TaskUnconfirmed
                                        | ev.StartFailed)
    try:
        state = TaskState(view.state)
    except ValueError:
        return
    view.state = apply(state, event, host=view.host, lifetime=view.lifetime).value


def step_of(metrics: dict[str, Any], default: Any = None) -> Any:
    """A progress report's step, the job's (job/record/reports.py), or `default`."""
    step = ProgressReport.read(metrics).step
    return default if step is None else step


def _mark(view: TaskView, event: ev.Progress) -> None:
    step = step_of(event.metrics)
    if not _number(step):
        return
    if view.marks and step < view.marks[-1][1]:  # a restart resumed earlier: start again
        view.marks = []
    view.marks = [*view.marks[-1:], (float(event.t or 0.0), float(step))]


def steps_per_s(marks: list[tuple[float, float]]) -> float | None:
    """Steps per second between two (time, step) marks: the one rate of every
    view (the live table, `status --watch`, the metrics, the report's chart)."""
    if len(marks) < 2 or marks[-1][0] <= marks[-2][0]:
        return None
    (t0, s0), (t1, s1) = marks[-2], marks[-1]
    return (s1 - s0) / (t1 - t0)


def fold(records: Iterable[dict[str, Any]]) -> Story:
    """The lines of events.jsonl (dicts, as read), folded whole."""
    story = Story()
    for record in records:
        story.tell(eventlines.from_record(record))
    return story


def records(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The lines of events.jsonl read one at a time (a half-written or damaged
    line is skipped)."""
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


RESTARTED_ALONE = "restarted alone (ParameterServerStrategy reschedules its work)"


def failure_json(event: ev.FailureDetected | ev.RootCause | ev.TaskRestarted
                 ) -> dict[str, Any]:
    """A failure as summary.json lists it (states.Failure.to_json), from its
    `failure_detected` (or `root_cause`) event; a worker restarted alone (its
    `task_restarted`) is one too, marked `restarted_alone`."""
    what = reason_of(event.failure, event.exit_code, event.signal, event.reason)
    alone = isinstance(event, ev.TaskRestarted)
    failure = Failure(task=task_label(event.host, event.task), host=event.host,
                      generation=event.generation,
                      t=event.at if event.at is not None else event.t, kind=event.failure,
                      reason=what + (f"; {RESTARTED_ALONE}" if alone else ""),
                      exit_code=event.exit_code, signal=event.signal,
                      last_lines=tuple(event.last_lines or ()), error=event.error)
    return {**failure.to_json(), **({"restarted_alone": True} if alone else {})}


def restarts_words(restarts: int, failures: Sequence[Mapping[str, Any]]) -> str:
    """`1 restart`, `no restarts`, `1 worker restarted alone`, `2 restarts; 1
    worker restarted alone 3 times`: the job's restarts, then its workers
    restarted alone (`failures` as summary.json lists them), in one phrase."""
    alone = [f for f in failures if f.get("restarted_alone")]
    said = [f"{restarts} restart{'s' if restarts != 1 else ''}"] if restarts else []
    if alone:
        workers = len({f.get("task") for f in alone})
        said.append(f"{workers} worker{'s' if workers != 1 else ''} restarted alone"
                    + (f" {len(alone)} times" if len(alone) != workers else ""))
    return "; ".join(said) or "no restarts"


def split_name(task: str) -> tuple[str, int]:
    match = _TASK_NAME.match(task)
    if match is None:
        return task, 0
    return match.group(1), int(match.group(2))


def kind_of(event: ev.Event) -> str:
    """An event's kind, typed or read back as Unknown."""
    return event.name if isinstance(event, ev.Unknown) else event.kind


def _seconds(value: Any) -> float | None:
    return float(value) if _number(value) else None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
