"""`mgpu-launch report RUN_DIR [-o FILE]`: a run told in one self-contained HTML file.

Owns reading a run directory (finished or still going) into a `Report`: each
task's timeline by generation (starting, joining, training, stopping, failed;
the job's restarts between generations), each fault with its root cause,
steps/s per task over time, the goodput, the stragglers, the cluster (hosts,
roles, versions) and the command. `report_html` draws it; `svg` draws the charts.

Read-only over the run directory but for the report file it writes (by
default RUN_DIR/report.html). Must not import supervisor, transport or cli.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..job import events as ev
from ..spec.plan import task_label
from ..spec.rundir import CONFIG, EVENTS, SUMMARY
from .records import RunView, load_run, read_config, read_events, read_json
from .replay import failure_from_event
from .svg import Mark, Span

REPORT = "report.html"  # the default output, in the run directory
JOB_ROW = "job"  # the timeline's last row: the restarts between generations


@dataclass
class Fault:
    """A generation's failure, blamed on its root cause."""

    number: int
    generation: int
    task: str  # host/name of the root cause
    name: str  # the task's name: worker1
    t: float  # seconds from the start of the run
    kind: str
    description: str
    blamed_later: bool = False  # a `root_cause` event named this task after the first failure


@dataclass
class Report:
    view: RunView
    t0: float  # Unix time of the run's first event
    duration_s: float  # the run's length so far (seconds from t0)
    rows: list[str] = field(default_factory=list)  # timeline rows: task names, then the job
    row_labels: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    rates: dict[str, list[list[tuple[float, float]]]] = field(default_factory=dict)
    goodput: dict[str, Any] | None = None  # summary.json's, as written
    stragglers: list[dict[str, Any]] | None = None  # None: not recorded
    hosts: list[dict[str, Any]] = field(default_factory=list)
    versions_recorded: bool = False
    command: list[str] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None

    @property
    def marks(self) -> list[Mark]:
        return [Mark(row=self.rows.index(f.name), t=f.t, label=str(f.number),
                     title=f"{f.number}: generation {f.generation}: {f.description}")
                for f in self.faults if f.name in self.rows]


def build(run_dir: str | os.PathLike, now: float | None = None) -> Report:
    """The report of the run in `run_dir` (raises RunDirError when it is none)."""
    run_dir = Path(run_dir)
    view = load_run(run_dir, now=now)
    records = read_events(run_dir / EVENTS)
    summary = read_json(run_dir / SUMMARY)
    events = [ev.from_record(r) for r in records]
    times = [e.t for e in events if e.t is not None]
    t0 = min(times) if times else (view.started_t or time.time())
    ended = next((e.t for e in reversed(events) if isinstance(e, ev.JobDone) and e.t), None)
    if view.finished:  # at the job's end: what was written after it (a notifier) is not
        end = ended if ended is not None else max(times, default=t0)  # the job's time
    else:
        end = time.time() if now is None else now
    report = Report(view=view, t0=t0, duration_s=max(0.0, end - t0), summary=summary,
                    config=read_config(run_dir / CONFIG))
    _timeline(report, events)
    report.faults = _faults(report, events, summary)
    # Rates over windows of 1/20 of the run up to 2 s (1/300 of a long run):
    # smooth enough to read, a few hundred points at most.
    gap = max(report.duration_s / 300, min(2.0, report.duration_s / 20))
    report.rates = _rates(events, t0, min_gap_s=gap)
    report.goodput = view.goodput  # as `status` says it (a running job's: up to now)
    report.stragglers = _stragglers(records, summary)
    first = next((e for e in events if isinstance(e, ev.Launch) and e.command is not None),
                 None)  # generation 0's launch: what ran, on what
    if first is not None and first.command is not None:
        report.command = [str(word) for word in first.command]
    report.hosts, report.versions_recorded = _hosts(report.config, events,
                                                    first.hosts if first else None)
    return report


# ------------------------------------------------------------------ timeline


class _Spans:
    """The open span of each (generation, task) and of the job's row."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.open: dict[tuple[int, str], tuple[str, float, str]] = {}  # -> state, start, host
        self.done: list[tuple[str, float, float, str, str]] = []  # name, start, end, state, title

    def switch(self, key: tuple[int, str], state: str | None, t: float,
               host: str = "") -> None:
        """Close `key`'s open span at t; open one in `state` (None: none)."""
        previous = self.open.pop(key, None)
        if previous is not None:
            old, start, host = previous[0], previous[1], host or previous[2]
            if old == state:
                self.open[key] = previous
                return
            where = f" on {host}" if host else ""
            title = f"{key[1]}{where}, generation {key[0]}: {old}, " \
                    f"{start - self.t0:.1f}-{t - self.t0:.1f} s"
            self.done.append((key[1], start - self.t0, t - self.t0, old, title))
        if state is not None:
            self.open[key] = (state, t, host)

    def state(self, key: tuple[int, str]) -> str | None:
        entry = self.open.get(key)
        return entry[0] if entry else None

    def of_generation(self, generation: int) -> list[tuple[int, str]]:
        return [k for k in self.open if k[0] == generation and k[1] != JOB_ROW]


def _timeline(report: Report, events: Sequence[ev.Event]) -> None:
    restarted = {e.generation for e in events if isinstance(e, ev.Restart)}
    spans = _Spans(report.t0)
    hosts: dict[str, list[str]] = {}
    failed_generations: set[int] = set()
    for event in events:
        t = event.t if event.t is not None else report.t0
        if isinstance(event, ev.Launch):
            spans.switch((-1, JOB_ROW), None, t)
            for placed in event.tasks:
                if isinstance(placed, ev.Placed):
                    names = hosts.setdefault(placed.task, [])
                    names += [] if placed.host in names else [placed.host]
                    spans.switch((event.generation, placed.task), "starting", t, placed.host)
        elif isinstance(event, ev.FailureDetected) \
                and event.generation not in failed_generations:
            failed_generations.add(event.generation)
            if (event.generation, event.task) in spans.open:  # else it has exited already
                spans.switch((event.generation, event.task), "failed", t)
            if event.generation + 1 in restarted:
                spans.switch((-1, JOB_ROW), "restarting", t)
        else:
            _task_moves(spans, event, t)
    for key in list(spans.open):
        spans.switch(key, None, report.t0 + report.duration_s)
    report.rows = [*hosts, JOB_ROW]
    report.row_labels = [f"{name} ({', '.join(on)})" for name, on in hosts.items()]
    report.row_labels.append("job (restarts)")
    row = {name: i for i, name in enumerate(report.rows)}
    report.spans = [Span(row=row[name], start=start, end=end, state=state, title=title)
                    for name, start, end, state, title in spans.done if name in row]


def _task_moves(spans: _Spans, event: ev.Event, t: float) -> None:
    """How `event` moves the spans of its task (or of its generation's tasks)."""
    if isinstance(event, ev.TaskEvent):
        key = (event.generation, event.task)
        state = spans.state(key)
        if isinstance(event, ev.Cluster) and state in ("starting", "joining"):
            spans.switch(key, "joining" if event.state == "joining" else "training", t)
        elif isinstance(event, ev.Progress) and state in ("starting", "joining"):
            spans.switch(key, "training", t)
        elif isinstance(event, ev.TaskRestarted):
            spans.switch(key, "failed", t)
            spans.switch(key, "starting", t)
        elif isinstance(event, ev.TaskExited | ev.TaskUnconfirmed | ev.StartFailed):
            spans.switch(key, None, t)
    elif isinstance(event, ev.TeardownBegun):
        for key in spans.of_generation(event.generation):
            if spans.state(key) != "failed":
                spans.switch(key, "stopping", t)
    elif isinstance(event, ev.HostLost):
        for key in spans.of_generation(event.generation):
            if spans.open[key][2] == event.host:
                spans.switch(key, "failed", t)


# -------------------------------------------------------------------- faults


def _faults(report: Report, events: Sequence[ev.Event],
            summary: dict[str, Any] | None) -> list[Fault]:
    """The first failure of each generation, blamed on its root cause: a later
    `root_cause` event wins over the first failure (a hang blamed on its peer)."""
    described = {f.get("generation"): f for f in (summary or {}).get("failures") or []
                 if isinstance(f, dict)}
    first: dict[int, ev.FailureDetected] = {}
    blamed: dict[int, ev.RootCause] = {}
    for event in events:
        if isinstance(event, ev.FailureDetected):
            first.setdefault(event.generation, event)
        elif isinstance(event, ev.RootCause):
            blamed[event.generation] = event
    faults = []
    for number, generation in enumerate(sorted(first), start=1):
        failure = first[generation]
        cause: ev.FailureDetected | ev.RootCause = blamed.get(generation, failure)
        label = task_label(cause.host, cause.task)
        if isinstance(cause, ev.RootCause):
            text = f"{label} (host {cause.host}, generation {generation}) {cause.reason}"
        else:
            text = str((described.get(generation) or failure_from_event(failure))
                       .get("description") or label)
        faults.append(Fault(number=number, generation=generation, task=label,
                            name=cause.task, t=(failure.t or report.t0) - report.t0,
                            kind=cause.failure, description=text,
                            blamed_later=isinstance(cause, ev.RootCause)))
    return faults


# --------------------------------------------------------------------- rates


def _rates(events: Sequence[ev.Event], t0: float,
           min_gap_s: float = 0.0) -> dict[str, list[list[tuple[float, float]]]]:
    """Steps/s per task over time, one piece per generation: the runtime's own
    `steps_per_s` when a progress report has it, else the steps between two
    reports at least `min_gap_s` apart over the seconds between them (a run of
    days keeps a few hundred points, each an average)."""
    pieces: dict[tuple[str, int], list[tuple[float, float]]] = {}
    last: dict[tuple[str, int], tuple[float, float]] = {}
    for event in events:
        if not isinstance(event, ev.Progress) or event.t is None:
            continue
        key = (event.task, event.generation)
        step, rate = event.metrics.get("step"), event.metrics.get("steps_per_s")
        points = pieces.setdefault(key, [])
        if _number(rate):
            if not points or event.t - t0 - points[-1][0] >= min_gap_s:
                points.append((event.t - t0, float(rate)))
            continue
        if not _number(step):
            continue
        before = last.get(key)
        if before is None or step < before[1]:  # the first report, or steps counted anew
            last[key] = (event.t, float(step))
        elif event.t - before[0] >= max(min_gap_s, 1e-6):
            points.append((event.t - t0, (step - before[1]) / (event.t - before[0])))
            last[key] = (event.t, float(step))
    rates: dict[str, list[list[tuple[float, float]]]] = {}
    for (task, _), points in sorted(pieces.items()):
        if points:
            rates.setdefault(task, []).append(points)
    return rates


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -------------------------------------------------------- stragglers, hosts


def _stragglers(records: Sequence[dict[str, Any]],
                summary: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """summary.json's stragglers, else the `straggler` events (of a run still
    going, or whose launcher died); None: not recorded (a summary without
    them, or events written before the radar existed)."""
    if summary is not None and isinstance(summary.get("stragglers"), list):
        return [s for s in summary["stragglers"] if isinstance(s, dict)]
    found = [r for r in records if r.get("event") == "straggler"]
    return found if found or (summary is None and any(ev.version(r) >= 2 for r in records)) \
        else None


def _hosts(config: dict[str, Any], events: Sequence[ev.Event],
           hosts: Sequence[Any] | None) -> tuple[list[dict[str, Any]], bool]:
    """One row per host: the cluster file's entry, the tasks it ran, its versions."""
    ran: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event, ev.Launch):
            for placed in event.tasks:
                if isinstance(placed, ev.Placed):
                    names = ran.setdefault(placed.host, [])
                    names += [] if placed.task in names else [placed.task]
    facts = {str(f.get("host")): f for f in hosts or () if isinstance(f, dict)}
    rows = []
    for entry in config.get("hosts") or []:
        if not isinstance(entry, dict):
            continue
        name = str(entry.get("name") or entry.get("address"))
        roles = entry.get("roles") or {}
        rows.append({"host": name, "address": entry.get("address"),
                     "roles": ", ".join(f"{k}: {v}" for k, v in roles.items()) or "default",
                     "spare": bool(entry.get("spare")), "tasks": ran.pop(name, []),
                     **facts.get(name, {"host": name})})
    for name, tasks in ran.items():  # hosts the config does not list (e.g. Slurm's)
        rows.append({"address": None, "roles": "", "spare": False, "tasks": tasks,
                     **facts.get(name, {}), "host": name})
    return rows, bool(facts)
