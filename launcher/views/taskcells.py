"""A task's cells in every view that lists tasks: one line per field and view.

The views that list tasks take their columns from here: `status` (its table,
and its `--json` task objects), the report's task table, and the live table
(the launcher's own and `status --watch`'s). So a new per-task field is three
code files (docs/design.md, "One model of the run"): the event or report that
carries it (launcher/job/record/events.py or reports.py), the fold that keeps
it (launcher/job/record/story.py: a field of `TaskView`, and of `TaskRow` for
the live table), and its cells here.

Pure: a task in, text (or a JSON value) out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..job.record.story import TaskRow, TaskView

T = TypeVar("T")

# States whose usage, rate and silence no longer mean anything (the live table).
_DONE = ("succeeded", "failed", "stopped", "lost", "pending")
DASH = "-"


@dataclass(frozen=True)
class Cell(Generic[T]):
    header: str
    text: Callable[[T], Any]  # the cell's text (the report's and --json's: a value)
    right: bool = False  # a number: right-aligned (the live table)
    omit_empty: bool = False  # --json: left out when empty


@dataclass(frozen=True)
class StatusWhere:
    """What `status`'s cells need beside the task: where and when it is read."""

    run_dir: Path
    now: float
    finished: bool
    logs: frozenset[str] | None  # the names in logs/ (None: not known)


# ----------------------------------------------------------------- the formats


def ago(seconds: float) -> str:
    if seconds < 1:
        return "now"
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s ago"
    return f"{minutes // 60}h{minutes % 60:02d}m ago"


def rate(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def mem(mb: float) -> str:
    return f"{mb:.0f} MB" if mb < 1024 else f"{mb / 1024:.1f} GB"


def _live(value: Any, row: TaskRow, text: Callable[[Any], str], done_dash: bool = True) -> str:
    """A live cell: a dash when unknown (or meaningless once the task is done)."""
    if value is None or done_dash and row.state in _DONE:
        return DASH
    return text(value)


def _state(row: TaskRow) -> str:
    return row.state if row.slowdown is None else f"{row.state} (straggler {row.slowdown:.2g}x)"


def _log(task: TaskView, where: StatusWhere) -> str:
    if task.log_path is None:
        return ""
    try:
        log = str(task.log_path.relative_to(where.run_dir))
    except ValueError:
        log = str(task.log_path)
    if where.logs is not None and task.log_path.name not in where.logs:
        log += " (no output yet)"
    return log


def _last_report(task: TaskView, where: StatusWhere) -> str:
    if task.last_progress_t is None or where.finished:
        return ""
    return f"{max(0.0, where.now - task.last_progress_t):.0f} s ago"


# ------------------------------------------------------------------- the views

LIVE: tuple[Cell[TaskRow], ...] = (
    Cell("HOST", lambda r: r.host),
    Cell("TASK", lambda r: r.task),
    Cell("STATE", _state),
    Cell("STEP", lambda r: _live(r.step, r, str, done_dash=False), right=True),
    Cell("STEPS/S", lambda r: _live(r.steps_per_s, r, rate), right=True),
    Cell("LOSS", lambda r: _live(r.loss, r, lambda v: f"{v:.4g}", done_dash=False), right=True),
    Cell("CPU", lambda r: _live(r.cpu_percent, r, lambda v: f"{v:.0f}%"), right=True),
    Cell("MEM", lambda r: _live(r.rss_mb, r, mem), right=True),
    Cell("LAST OUTPUT", lambda r: _live(r.silent_s, r, ago)),
)

# `status`'s table: (task, where) in, text out.
STATUS: tuple[Cell[tuple[TaskView, StatusWhere]], ...] = (
    Cell("TASK", lambda tw: tw[0].label),
    Cell("ROLE", lambda tw: f"{tw[0].role} {tw[0].index}"),
    Cell("STATE", lambda tw: tw[0].state),
    Cell("EXIT", lambda tw: tw[0].exit_text()),
    Cell("STEP", lambda tw: "" if tw[0].last_step is None else str(tw[0].last_step)),
    Cell("LAST REPORT", lambda tw: _last_report(*tw)),
    Cell("LOG", lambda tw: _log(*tw)),
)

# `status --json`'s task objects: the header is the key, the text the value.
JSON: tuple[Cell[TaskView], ...] = (
    Cell("task", lambda t: t.label), Cell("host", lambda t: t.host),
    Cell("role", lambda t: t.role), Cell("index", lambda t: t.index),
    Cell("generation", lambda t: t.generation), Cell("state", lambda t: t.state),
    Cell("address", lambda t: t.address), Cell("port", lambda t: t.port),
    Cell("pid", lambda t: t.pid), Cell("exit_code", lambda t: t.exit_code),
    Cell("signal", lambda t: t.signal), Cell("last_step", lambda t: t.last_step),
    Cell("last_progress", lambda t: t.last_progress),
    Cell("log", lambda t: str(t.log_path) if t.log_path else None),
    # a ParameterServerStrategy worker's restarts alone, when it had any
    Cell("restarted_alone", lambda t: t.restarted_alone, omit_empty=True),
)

# The report's task table (launcher/views/report_html.py): values, None shown empty.
REPORT: tuple[Cell[TaskView], ...] = (
    Cell("task", lambda t: t.label), Cell("role", lambda t: t.role),
    Cell("generation", lambda t: t.generation), Cell("state", lambda t: t.state),
    Cell("exit", lambda t: t.exit_text() or None), Cell("last step", lambda t: t.last_step),
    Cell("restarted alone", lambda t: t.restarted_alone or None),
)


def live_cells(row: TaskRow) -> list[str]:
    return [cell.text(row) for cell in LIVE]


def task_json(task: TaskView) -> dict[str, Any]:
    return {cell.header: value for cell in JSON
            if (value := cell.text(task)) or not cell.omit_empty}
