"""A `Report` (launcher/views/report.py) as one self-contained HTML page.

No script, no external font, style sheet or image: the page opens from disk
with no network, and its Content-Security-Policy forbids loading anything, so
a run's own words (task names, messages, the command) can never fetch or run
anything even if one escaped `esc` (none should: every value from the run goes
through it).

Pure: a Report in, text out.
"""

from __future__ import annotations

import datetime
import json
import shlex
from collections.abc import Sequence
from typing import Any

from .. import __version__
from ..job.record.goodput import PARTS
from . import rootcause, taskcells
from .report import LOSS_COLOR, Report
from .svg import esc, line_chart, stacked_bar, timeline

# The colours of the goodput ledger's parts (summary.json `goodput.parts`; the
# parts and their order: job/record/goodput.py PARTS); a part not here is grey.
PART_COLOURS = {"training": "#3c9a5f", "startup": "#9aa5b1", "recovery": "#d64545",
                "redone": "#e58a3a", "checkpointing": "#2f6fd1",
                "waiting_for_hosts": "#7a6fd0", "other": "#c8c8c8"}
NOT_RECORDED = '<p class="none">not recorded{}</p>'

STYLE = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 24px auto; max-width: 1000px;
       color: #1d2430; background: #ffffff; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px;
     border-bottom: 1px solid #dde1e7; padding-bottom: 4px; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 3px 10px 3px 0;
     text-align: left; vertical-align: top; } th { color: #5b6573; font-weight: normal; }
pre { background: #f4f5f7; padding: 8px; overflow-x: auto; font-size: 12px;
      white-space: pre-wrap; word-break: break-all; }
.status { display: inline-block; padding: 2px 8px; border-radius: 3px; color: #fff; }
.succeeded { background: #3c9a5f; } .failed, .aborted { background: #d64545; }
.running { background: #2f6fd1; } .interrupted, .unknown { background: #8a8f98; }
.none { color: #8a8f98; font-style: italic; } .fault { color: #d64545; font-weight: bold; }
"""


def render(report: Report) -> str:
    """The whole page."""
    view = report.view
    title = f"{view.name or 'run'}: {view.status}"
    body = [_header(report), _timeline(report), _tasks(report), _rates(report), _goodput(report),
            _stragglers(report), _cluster(report),
            f'<p class="none">written by mgpu-launch {esc(__version__)} at '
            f'{esc(_when(None))}</p>']
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
            "style-src 'unsafe-inline'; img-src data:\">\n"
            f"<title>{esc(title)}</title>\n<style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _when(t: float | None) -> str:
    moment = datetime.datetime.now(datetime.UTC) if t is None else \
        datetime.datetime.fromtimestamp(t, datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(_cell(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict | list):
        return json.dumps(value, default=str, sort_keys=True)
    return str(value)


def _header(report: Report) -> str:
    view = report.view
    wall = view.wall_s if isinstance(view.wall_s, int | float) else report.duration_s
    rows = [("status", f'<span class="status {esc(view.status)}">{esc(view.status)}</span> '
                       f"{esc(view.status_detail)}"),
            ("started", esc(_when(report.t0))),
            ("length", f"{wall:.1f} s"),
            ("generations", f"{view.generation + 1} ({view.restarts} restart"
                            f"{'' if view.restarts == 1 else 's'})"),
            ("strategy", esc(view.strategy or "?")),
            ("transport", esc(view.transport or "?")),
            ("run directory", esc(view.run_dir.resolve()))]
    command = (f"<pre>{esc(shlex.join(report.command))}</pre>" if report.command
               else NOT_RECORDED.format(" (written by an mgpu-launch before the command "
                                        "was recorded)"))
    table = "".join(f"<tr><th>{name}</th><td>{value}</td></tr>" for name, value in rows)
    return (f"<h1>{esc(view.name or 'run')}</h1><table>{table}</table>"
            f"<h2>Command</h2><p>every task ran:</p>{command}")


def _timeline(report: Report) -> str:
    if len(report.rows) <= 1:
        return "<h2>Timeline</h2>" + NOT_RECORDED.format(" (no task launched yet)")
    chart = timeline(report.row_labels, report.spans, report.marks, report.duration_s)
    losses = (f'; a <span style="color: {LOSS_COLOR}">purple !</span> is the step whose loss '
              "went non-finite, a purple ^ a loss spike, on the task that saw it first"
              if report.losses else "")
    return ("<h2>Timeline</h2><p>each task by generation; a red mark is a fault, "
            f"numbered below, on the task blamed for it{losses}</p>" + chart + _faults(report))


def _faults(report: Report) -> str:
    resumed = "".join(f"<li>{esc(line)}</li>" for line in report.view.resumed)
    resumed = f"<h3>Resumed</h3><ul>{resumed}</ul>" if resumed else ""
    loss = "".join(f"<li>{esc(line)}</li>" for line in report.view.nonfinite)
    loss = f"<h3>Loss</h3><ul>{loss}</ul>" if loss else ""
    return _fault_list(report) + loss + resumed


def _fault_list(report: Report) -> str:
    if not report.faults:
        return "<p>no fault</p>"
    items = []
    for fault in report.faults:
        blame = " (blamed after the first failure)" if fault.blamed_later else ""
        what = "restarted alone" if fault.restarted_alone else "root cause"
        items.append(f'<li><span class="fault">{fault.number}</span> at {fault.t:.1f} s, '
                     f"generation {fault.generation}, {esc(fault.kind)}: {what} "
                     f"<b>{esc(fault.task)}</b>{esc(blame)}: {esc(fault.description)}</li>")
    return "<h3>Faults</h3><ol>" + "".join(items) + "</ol>" + _root_cause(report)


def _tasks(report: Report) -> str:
    """Each task of the last generation as `status` shows it: its state (a
    finished job's final one), exit, last step, restarts alone."""
    tasks = report.view.tasks
    if not tasks:
        return ""
    rows = [tuple(cell.text(t) for cell in taskcells.REPORT) for t in tasks]
    return "<h3>Tasks</h3>" + _table(tuple(cell.header for cell in taskcells.REPORT), rows)


def _root_cause(report: Report) -> str:
    """The job's final root cause (summary.json): where it was stuck, its last
    lines, its exception (views/rootcause.py picks them)."""
    cause = report.view.root_cause
    if not isinstance(cause, dict):
        return ""
    said = rootcause.words(cause, last=20)
    parts = [f"<h3>Root cause of the job's end</h3><p>{esc(said.description)}</p>"]
    if said.stack:
        parts.append("<p>where it was stuck (innermost frame first):</p><pre>"
                     + esc("\n".join(said.stack)) + "</pre>")
    if said.last_lines:
        parts.append("<p>its last lines:</p><pre>" + esc("\n".join(said.last_lines)) + "</pre>")
    if said.traceback:
        parts.append("<pre>Traceback (most recent call last):\n"
                     f"{esc(said.traceback)}\n{esc(said.exception)}</pre>")
    return "".join(parts)


def _rates(report: Report) -> str:
    if not report.rates:
        return "<h2>Steps per second</h2>" + NOT_RECORDED.format(" (no task reported steps)")
    chart = line_chart(report.rates, report.duration_s, "steps/s",
                       marks=[f.t for f in report.faults])
    return ("<h2>Steps per second</h2><p>per task, from its progress reports; dashed: "
            "the faults</p>" + chart)


def _goodput(report: Report) -> str:
    goodput = report.goodput
    if not goodput:
        why = (" (written by an mgpu-launch before the goodput ledger)" if report.view.tasks
               else " (no task launched yet)")
        return "<h2>Goodput</h2>" + NOT_RECORDED.format(why)
    parts = goodput.get("parts") or {}
    known = [(name, float(parts.get(name) or 0.0), PART_COLOURS.get(name, "#bbbbbb"))
             for name in PARTS]
    known += [(str(name), float(value), "#bbbbbb") for name, value in parts.items()
              if name not in PARTS and isinstance(value, int | float)]
    wall = goodput.get("wall_s")
    wall = float(wall) if isinstance(wall, int | float) and wall > 0 else \
        sum(v for _, v, _ in known) or 1.0
    rows = [(name, f"{value:.1f} s", f"{100.0 * value / wall:.1f} %") for name, value, _ in
            known]
    productive = goodput.get("productive_s")
    lead = (f"<p>productive {float(productive):.1f} s of {wall:.1f} s: "
            f"<b>{100.0 * float(productive) / wall:.1f} %</b></p>"
            if isinstance(productive, int | float) else "")
    return ("<h2>Goodput</h2>" + lead + stacked_bar(known)
            + _table(("part", "time", "share"), rows))


def _stragglers(report: Report) -> str:
    stragglers = report.stragglers
    if stragglers is None:
        return "<h2>Stragglers</h2>" + NOT_RECORDED.format("")
    if not stragglers:
        so_far = " so far" if not report.view.finished else ""
        return f"<h2>Stragglers</h2><p>none{so_far}: no task was slower than its peers</p>"
    rows = []
    for entry in stragglers:
        slowdown = entry.get("slowdown")
        rows.append((entry.get("task"), entry.get("host"),
                     f"{slowdown:.2f}x" if isinstance(slowdown, int | float) else slowdown,
                     entry.get("evidence")))
    return "<h2>Stragglers</h2>" + _table(("task", "host", "slowdown", "evidence"), rows)


def _cluster(report: Report) -> str:
    if not report.hosts:
        return "<h2>Cluster</h2>" + NOT_RECORDED.format("")
    header = ("host", "address", "roles", "tasks run", "spare", "hostname", "mgpu-launch",
              "python", "tensorflow", "keras", "tf_keras")
    rows = [(h.get("host"), h.get("address"), h.get("roles"), ", ".join(h.get("tasks") or []),
             "yes" if h.get("spare") else "no", h.get("hostname"), h.get("mgpu_launch"),
             h.get("python"), h.get("tensorflow"), h.get("keras"), h.get("tf_keras"))
            for h in report.hosts]
    note = "" if report.versions_recorded else NOT_RECORDED.format(
        ": the versions (written by an mgpu-launch before they were recorded)")
    return "<h2>Cluster</h2>" + _table(header, rows) + note
