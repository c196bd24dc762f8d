"""A run directory's files rendered (for `mgpu-launch status`, `logs` and
`report`, launcher/commands/): what the launcher wrote, as a `RunView`.

Pure: `run_view` folds the files one reader read (launcher/outlets/rundir.py:
`read_run`, `load_run`) into a `RunView`, and `render_status` prints it.
Works on a finished run and on one still going: the run is the model folded
from `events.jsonl` (launcher/job/record/story.py); `summary.json` says the run
ended, and fills in only what an older `events.jsonl` did not say.

Must not import supervisor, transport or cli (a run directory is data).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..job.record.classify import signal_name
from ..job.record.eventlines import version as ev_version
from ..job.record.events import fields_of
from ..job.record.goodput import PARTS as GOODPUT_PARTS
from ..job.record.story import Story, TaskView, fold, restarts_words, split_name, step_of
from ..spec.rundir import (
    LOGS,
    STACKS,
    SUMMARY,
    RunFiles,
    log_file_name,
)
from . import narrate, rootcause, taskcells


@dataclass
class RunView:
    run_dir: Path
    name: str | None
    strategy: str | None
    transport: str | None
    status: str  # running | succeeded | failed | interrupted | aborted
    status_detail: str
    generation: int
    restarts: int
    started_t: float | None
    wall_s: float | None
    tasks: list[TaskView]
    root_cause: dict[str, Any] | None
    failures: list[dict[str, Any]]
    last_event_t: float | None
    goodput: dict[str, Any] | None = None  # where the time went (job/record/goodput.py)
    stragglers: tuple[str, ...] = ()  # the straggler radar's lines (docs/stragglers.md)
    # A task resumed behind the last save (job/detect/resumes.py).
    resume_behind: tuple[str, ...] = ()
    resumed: tuple[str, ...] = ()  # where each restarted generation resumed, in words
    passed_over: tuple[str, ...] = ()  # checkpoints a restore could not read (runtime/readable)
    nonfinite: tuple[str, ...] = ()  # a loss or a save gone non-finite (job/detect/sentinel.py)
    metrics_url: str | None = None  # where its metrics are served (a metrics_served event)
    story: Story | None = None  # the events folded (launcher/job/record/story.py)
    events: list[dict[str, Any]] | None = None  # events.jsonl's lines, as read
    summary: dict[str, Any] | None = None  # summary.json, as read
    config: dict[str, Any] = field(default_factory=dict)  # config.yaml, as read
    launcher_out: Path | None = None  # a detached launcher's own output
    logs: frozenset[str] | None = None  # the names in logs/ (None: not known)
    summary_written: bool = False  # summary.json is there (read or not)

    @property
    def finished(self) -> bool:
        return self.status != "running"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": str(self.run_dir),
            "name": self.name,
            "strategy": self.strategy,
            "transport": self.transport,
            "status": self.status,
            "status_detail": self.status_detail,
            "generation": self.generation,
            "restarts": self.restarts,
            "started_t": self.started_t,
            "wall_s": self.wall_s,
            "root_cause": self.root_cause,
            "failures": self.failures,
            **({"goodput": self.goodput} if self.goodput is not None else {}),
            **({"metrics_url": self.metrics_url} if self.metrics_url else {}),
            "logs_dir": str(self.run_dir / LOGS),
            # where each restarted generation resumed (summary.json's `resumed` too)
            **({"resumed": [fields_of(e) for e in self.story.resumes]}
               if self.story and self.story.resumes else {}),
            "tasks": [taskcells.task_json(t) for t in self.tasks],
        }


def run_view(files: RunFiles, now: float | None = None) -> RunView:
    """The run its files tell, finished or not (`now`: the moment a running job
    is seen at, for its goodput so far; the clock's when None)."""
    run_dir, config, events, summary = files.run_dir, files.config, files.events, files.summary
    story = fold(events)
    for view in story.tasks.values():
        view.log_path = run_dir / LOGS / log_file_name(view.host, view.name)
    started_t = story.first_launch.get("t") if story.first_launch else None
    restarts, root_cause, wall_s = story.restarts, None, None
    failures = _filled(story, (summary or {}).get("failures"))
    if summary is not None:  # the launcher wrote its end: the events say how it went
        end = _end_of(story, summary)
        status, detail = _finished(end)
        restarts, wall_s = int(end.get("restarts") or 0), end.get("wall_s")
        causes = [f for f in failures if not f.get("restarted_alone")]
        root_cause = causes[-1] if status == "failed" and causes else None
        _final_states(story, summary)
    else:
        status, detail = _still_going(files.launcher_alive, started_t, files.detached)
    return RunView(
        run_dir=run_dir, name=config.get("name"), strategy=config.get("strategy"),
        transport=config.get("transport"), status=status, status_detail=detail,
        generation=story.generation, restarts=restarts, started_t=started_t, wall_s=wall_s,
        tasks=list(story.tasks.values()), root_cause=root_cause, failures=failures,
        last_event_t=events[-1].get("t") if events else None,
        goodput=_goodput_of(summary, story, events, status, now),
        stragglers=_said(story.straggler_events), resume_behind=_said(story.resume_behind),
        resumed=_said(story.resumes), passed_over=_said(story.passed_over),
        nonfinite=_said(story.nonfinite),
        metrics_url=story.metrics_url, story=story, events=events, summary=summary,
        config=config, launcher_out=files.launcher_out, logs=files.logs,
        summary_written=files.summary_written,
    )


def _said(events: Sequence[Any]) -> tuple[str, ...]:
    """The events in the terminal's words (launcher/views/narrate.py)."""
    return tuple(said[1] for e in events if (said := narrate.line(e)) is not None)


def _finished(summary: dict[str, Any]) -> tuple[str, str]:
    """(status, detail) of a run whose launcher wrote summary.json."""
    wall_s = summary.get("wall_s")
    detail = f"took {wall_s:.1f} s" if isinstance(wall_s, int | float) else "finished"
    if isinstance(summary.get("interrupted_by"), int):  # one parenthesis: status wraps detail
        detail += f", ended by {signal_name(summary['interrupted_by'])}"
    if summary.get("stopped_by"):  # the restart rule that ended a failed job
        rule = str(summary["stopped_by"])
        why = summary.get("message") or _RULE_WORDS.get(rule, "")
        detail += f"; stopped by {rule}" + (f": {why}" if why else "")
    return str(summary.get("status", "unknown")), detail


# A rule that ended a job without a message of its own (recovery.STOPPED_BY_*).
_RULE_WORDS = {"no_restarts": "restart.max_restarts is 0: a failure is never restarted"}


def _still_going(verdict: bool | None, started_t: float | None,
                 detached: dict[str, Any] | None) -> tuple[str, str]:
    """(status, detail) of a run without summary.json: running, or aborted when
    its launcher is known to be gone (`verdict` False; None: cannot tell)."""
    if verdict is False:
        return "aborted", ("the launcher is gone and wrote no summary.json "
                           "(killed, or its machine went down); tasks shown as last recorded")
    since = f" {time.time() - started_t:.0f} s" if started_t else ""
    detail = f"started{since} ago" if since else "no task launched yet"
    if not since and detached:
        detail = (f"launcher pid {detached['launcher_pid']} starting in the "
                  "background; no task launched yet")
    if verdict is None:
        detail += "; no summary.json yet"
    return "running", detail


def _end_of(story: Story, summary: dict[str, Any] | None) -> dict[str, Any]:
    """How the job ended, in summary.json's keys: as its `job_done` event says
    it; summary.json fills in only what the events lack (a run written before
    they said it, or a launcher that died before its `job_done`)."""
    end = dict(summary or {})
    done = story.ended
    if done is not None:
        end.update(status=done.status, wall_s=done.wall_s, restarts=done.restarts,
                   stopped_by=done.stopped_by or end.get("stopped_by"),
                   interrupted_by=done.interrupted_by or end.get("interrupted_by"),
                   message=done.message or end.get("message") or "")
    return end


def _filled(story: Story, written: Any) -> list[dict[str, Any]]:
    """The failures the events tell; summary.json's fill in what they lack (the
    time on the host, the last lines, the traceback: an older events.jsonl did
    not say them; a generation whose failure no event told)."""
    by_generation = {f.get("generation"): f for f in written or []
                     if isinstance(f, dict) and not f.get("restarted_alone")}
    out = []
    for failure in story.failure_list():
        if failure.get("restarted_alone"):  # told whole by its task_restarted event
            out.append(failure)
            continue
        kept = by_generation.pop(failure["generation"], None)
        if kept is not None and kept.get("task") == failure["task"]:
            told = {k: v for k, v in failure.items() if v not in (None, [])}
            if failure["generation"] in story.untimed:
                told.pop("t", None)
            failure = {**kept, **told}
        out.append(failure)
    return sorted(out + list(by_generation.values()), key=_generation)


def _final_states(story: Story, summary: dict[str, Any] | None) -> None:
    """The tasks as the job's end left them; summary.json adds only tasks no
    event placed (a run directory without events.jsonl)."""
    for view in story.tasks.values():
        view.state = view.final_state
    for label, final in ((summary or {}).get("tasks") or {}).items():
        host, _, name = label.partition("/")
        view = story.tasks.get(name)
        if view is not None and view.host == host:
            continue
        role, index = split_name(name)
        view = story.tasks[name] = TaskView(label=label, host=host, role=role, index=index,
                                            generation=0)
        view.state = final.get("state", view.state)
        view.exit_code, view.signal = final.get("exit_code"), final.get("signal")
        view.pid = final.get("pid")
        view.last_progress = final.get("last_progress") or {}
        view.last_step = step_of(view.last_progress)


# ------------------------------------------------------------------- status


def render_status(view: RunView, now: float | None = None) -> str:
    now = time.time() if now is None else now
    restarts = f"{view.restarts} restart{'s' if view.restarts != 1 else ''}"
    if any(f.get("restarted_alone") for f in view.failures):
        restarts = restarts_words(view.restarts, view.failures)
    lines = [
        f"run:        {view.run_dir}",
        f"job:        {view.name or '?'} (strategy {view.strategy or '?'}, "
        f"transport {view.transport or '?'})",
        f"status:     {view.status} ({view.status_detail})",
        f"generation: {view.generation} ({restarts})",
        "",
    ]
    header = tuple(cell.header for cell in taskcells.STATUS)
    where = taskcells.StatusWhere(view.run_dir, now, view.finished, view.logs)
    rows = [tuple(cell.text((task, where)) for cell in taskcells.STATUS) for task in view.tasks]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
    if not rows:
        lines.append("(no task launched yet)")
    lines += _causes(view)
    if view.goodput:
        lines += ["", goodput_line(view.goodput)]
    if view.stragglers:
        lines += ["", *view.stragglers]
    if view.resumed or view.resume_behind:
        lines += ["", *view.resumed, *view.resume_behind]
    if view.passed_over:
        lines += ["", *view.passed_over]
    if view.nonfinite:
        lines += ["", *view.nonfinite]
    lines += ["", f"logs:       {view.run_dir / LOGS}"]
    if view.launcher_out is not None:  # a detached run: the launcher's own lines
        lines.append(f"launcher:   {view.launcher_out}")
    if view.metrics_url and not view.finished:  # served while the launcher runs
        lines.append(f"metrics:    {view.metrics_url}")
    if view.finished and view.summary_written:  # none from a killed launcher
        lines.append(f"summary:    {view.run_dir / SUMMARY}")
    return "\n".join(lines)


def _causes(view: RunView) -> list[str]:
    """The root cause (its traceback and last lines), then the other failures:
    those of earlier generations caused restarts; those of the last did not (yet)."""
    lines: list[str] = []
    cause = view.root_cause
    if cause:
        lines += ["", *rootcause.lines(cause, str(view.run_dir / STACKS))]
    others = [f for f in view.failures if f is not cause and f != cause]
    alone = [f for f in others if f.get("restarted_alone")]
    others = [f for f in others if f not in alone]
    # A failure of an earlier generation caused a restart; one of the last did not (yet).
    restarted = [f for f in others if _generation(f) < view.generation]
    last = [f for f in others if f not in restarted]
    for title, listed in (("failures that caused a restart:", restarted),
                          (f"failures of generation {view.generation}:", last),
                          ("workers restarted alone (the job went on):", alone)):
        if listed:
            lines += ["", title, *(f"  {f.get('description') or f.get('task')}" for f in listed)]
    return lines


def _generation(failure: dict[str, Any]) -> int | float:
    generation = failure.get("generation")
    return generation if isinstance(generation, int) else float("inf")  # not known: the last


# The ledger's parts (job/record/goodput.py PARTS, in its order) as `status` words
# them; a part not here is said by its name.
_PART_WORDS = {"startup": "start-up", "redone": "re-done", "checkpointing": "checkpoints",
               "waiting_for_hosts": "waiting for hosts"}


def _goodput_of(summary: dict[str, Any] | None, story: Story, events: list[dict[str, Any]],
                status: str, now: float | None = None) -> dict[str, Any] | None:
    """The story's ledger: a finished job's to its end, a run still going's up
    to now (summary.json's `goodput` is the same ledger, written by the launch
    from the same events). A run written before the ledger (events of schema 1,
    or a summary without `goodput`) has none: it lacks what the ledger reads."""
    if not any(ev_version(e) >= 2 for e in events):
        return None if summary is None else summary.get("goodput")
    if summary is not None and summary.get("goodput") is None:
        return None
    if status != "running":
        return story.goodput()  # to its last event (a launcher gone)
    return story.goodput(time.time() if now is None else now)


def goodput_line(ledger: dict[str, Any]) -> str:
    """`goodput 91 % (training 54 m, start-up 1 m, recovery 2 m, ...)`: parts over 0."""
    wall = float(ledger.get("wall_s") or 0.0)
    parts = ledger.get("parts") or {}
    share = f"{100 * float(ledger.get('productive_s') or 0.0) / wall:.0f} %" if wall else "-"
    said = [f"{_PART_WORDS.get(key, key)} {_duration(float(parts.get(key) or 0.0))}"
            for key in GOODPUT_PARTS if key == "training" or float(parts.get(key) or 0.0) >= 0.5]
    return f"goodput {share} ({', '.join(said)})"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
