"""`mgpu-launch report RUN_DIR [-o FILE]`: a run told in one self-contained HTML file.

Owns reading a run directory (finished or still going) into a `Report`: each
task's timeline by generation (starting, joining, training, serving, stopping, failed;
the job's restarts between generations), each fault with its root cause,
steps/s per task over time, the goodput, the stragglers, the cluster (hosts,
roles, versions) and the command. `report_html` draws it; `svg` draws the charts.

Read-only over the run directory but for the report file it writes (by
default RUN_DIR/report.html). Must not import supervisor, transport or cli.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..job.record import eventlines
from ..job.record import events as ev
from ..job.record.reports import ProgressReport
from ..job.record.story import Story, failure_json, fold, steps_per_s
from ..job.record.timeline import JOB_ROW
from ..spec.plan import task_label
from . import narrate
from .records import RunView
from .svg import Mark, Span

REPORT = "report.html"  # the default output, in the run directory
LOSS_COLOR = "#7b3fb5"  # the marks of a loss gone bad (the NaN sentinel's) on the timeline


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
    restarted_alone: bool = False  # a ParameterServerStrategy worker: the job went on


@dataclass
class Report:
    view: RunView
    t0: float  # Unix time of the run's first event
    duration_s: float  # the run's length so far (seconds from t0)
    rows: list[str] = field(default_factory=list)  # timeline rows: task names, then the job
    row_labels: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    losses: list[Mark] = field(default_factory=list)  # a loss gone bad, at its step
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
        """The loss's marks first: a fault heard at the same moment is drawn over them."""
        return [*self.losses, *(
            Mark(row=self.rows.index(f.name), t=f.t, label=str(f.number),
                 title=f"{f.number}: generation {f.generation}: {f.description}")
            for f in self.faults if f.name in self.rows)]


def build(view: RunView, now: float | None = None) -> Report:
    """The report of the run `view` shows (launcher/outlets/rundir.py: load_run)."""
    records, summary = view.events or [], view.summary
    events = [eventlines.from_record(r) for r in records]
    times = [e.t for e in events if e.t is not None]
    t0 = min(times) if times else (view.started_t or time.time())
    ended = next((e.t for e in reversed(events) if isinstance(e, ev.JobDone) and e.t), None)
    if view.finished:  # at the job's end: what was written after it (a notifier) is not
        end = ended if ended is not None else max(times, default=t0)  # the job's time
    else:
        end = time.time() if now is None else now
    report = Report(view=view, t0=t0, duration_s=max(0.0, end - t0), summary=summary,
                    config=view.config)
    story = view.story if view.story is not None else fold(records)
    _timeline(report, story)
    report.faults = _faults(report, story)
    report.losses = _losses(report, story)
    # Rates over windows of 1/20 of the run up to 2 s (1/300 of a long run):
    # smooth enough to read, a few hundred points at most.
    gap = max(report.duration_s / 300, min(2.0, report.duration_s / 20))
    report.rates = _rates(events, t0, min_gap_s=gap)
    report.goodput = view.goodput  # as `status` says it (a running job's: up to now)
    report.stragglers = _stragglers(story, records, summary)
    first = story.launch  # generation 0's launch: what ran, on what
    if first is not None and first.command is not None:
        report.command = [str(word) for word in first.command]
    report.hosts, report.versions_recorded = _hosts(report.config, events,
                                                    first.hosts if first else None)
    return report


# ------------------------------------------------------------------ timeline


def _timeline(report: Report, story: Story) -> None:
    """The story's spans (launcher/job/record/timeline.py) as the chart's rows: each
    task's activity by generation, then the job's restarts."""
    report.rows = [*story.placed, JOB_ROW]
    report.row_labels = [f"{name} ({', '.join(on)})" for name, on in story.placed.items()]
    report.row_labels.append("job (restarts)")
    row = {name: i for i, name in enumerate(report.rows)}
    t0 = report.t0
    for span in story.timeline.spans(t0 + report.duration_s):
        if span.task not in row:
            continue
        where = f" on {span.host}" if span.host else ""
        what = (f"{span.task}: {span.activity} as generation {span.generation}"
                if span.task == JOB_ROW else
                f"{span.task}{where}, generation {span.generation}: {span.activity}")
        title = f"{what}, {span.start - t0:.1f}-{span.end - t0:.1f} s"
        report.spans.append(Span(row=row[span.task], start=span.start - t0,
                                 end=span.end - t0, state=span.activity, title=title))


# -------------------------------------------------------------------- faults


def _faults(report: Report, story: Story) -> list[Fault]:
    """The first failure of each generation, blamed on its root cause: a later
    `root_cause` event wins over the first failure (a hang blamed on its peer),
    said as `status` says it; and each worker restarted alone, in time."""
    described = {f.get("generation"): f for f in report.view.failures
                 if not f.get("restarted_alone")}
    faults = []
    for failure, cause in story.faults():
        generation = failure.generation
        label = task_label(cause.host, cause.task)
        text = (described.get(generation) or failure_json(cause)).get("description") or label
        faults.append(Fault(number=0, generation=generation, task=label,
                            name=cause.task, t=(failure.t or report.t0) - report.t0,
                            kind=cause.failure, description=str(text),
                            blamed_later=isinstance(cause, ev.RootCause)))
    for alone in story.alone:
        faults.append(Fault(number=0, generation=alone.generation,
                            task=task_label(alone.host, alone.task), name=alone.task,
                            t=(alone.t or report.t0) - report.t0, kind=alone.failure,
                            description=failure_json(alone)["description"],
                            restarted_alone=True))
    faults.sort(key=lambda f: (f.generation, f.t))
    for number, fault in enumerate(faults, start=1):
        fault.number = number
    return faults


def _losses(report: Report, story: Story) -> list[Mark]:
    """A mark on the task's row when its loss went bad at a step (the NaN
    sentinel's `nonfinite`, `!`, heard within a step of it) or spiked
    (`loss_spike`, `^`), titled as the terminal words it."""
    marks = []
    for event in story.nonfinite:
        if not isinstance(event, ev.Nonfinite | ev.LossSpike) or event.task not in report.rows:
            continue
        said = narrate.line(event)
        marks.append(Mark(row=report.rows.index(event.task),
                          t=(event.t or report.t0) - report.t0,
                          label="!" if isinstance(event, ev.Nonfinite) else "^",
                          title=said[1] if said else event.kind, color=LOSS_COLOR))
    return marks


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
        said = ProgressReport.read(event.metrics)
        step, rate = said.step, said.steps_per_s
        points = pieces.setdefault(key, [])
        if rate is not None:
            if not points or event.t - t0 - points[-1][0] >= min_gap_s:
                points.append((event.t - t0, float(rate)))
            continue
        if step is None:
            continue
        before = last.get(key)
        if before is None or step < before[1]:  # the first report, or steps counted anew
            last[key] = (event.t, float(step))
        elif event.t - before[0] >= max(min_gap_s, 1e-6):
            now = (event.t, float(step))
            points.append((event.t - t0, steps_per_s([before, now]) or 0.0))
            last[key] = now
    rates: dict[str, list[list[tuple[float, float]]]] = {}
    for (task, _), points in sorted(pieces.items()):
        if points:
            rates.setdefault(task, []).append(points)
    return rates


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -------------------------------------------------------- stragglers, hosts


def _stragglers(story: Story, records: Sequence[dict[str, Any]],
                summary: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The stragglers the story names; None: not recorded (events written before
    the radar existed, or a summary written without them)."""
    if not any(eventlines.version(r) >= 2 for r in records) or \
            (summary is not None and not isinstance(summary.get("stragglers"), list)):
        return None
    return story.named()


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
