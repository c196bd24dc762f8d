"""The live status view on a terminal: one row per task, redrawn in place below
the streamed log lines.

`render()` is pure: `TaskRow` snapshots in, screen lines out, each cut to the
terminal's width and the whole table to its height, so the view always knows
how many lines it occupies. The terminal it is drawn on is the outlets'
(launcher/outlets/screen.py: `LiveScreen`).

Must not import: supervisor, cli, transport (it only reads `TaskRow`s).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..job.record.story import TaskRow

# States whose usage, rate and silence no longer mean anything.
_DONE = ("succeeded", "failed", "stopped", "lost")
_STATE_STYLE = {
    "pending": "2", "starting": "36", "running": "32", "succeeded": "1;32",
    "failed": "1;31", "stopping": "33", "stopped": "2", "lost": "31",
}
# Rows shown first when the terminal is too short for every task.
_ATTENTION = ("failed", "lost", "stopping", "starting", "pending")
# A running task silent this long is shown in yellow (a hang is declared by
# the supervisor at restart.hang_timeout_s, usually much later).
QUIET_WARN_S = 60.0
COLUMNS = ("HOST", "TASK", "STATE", "STEP", "STEPS/S", "LOSS", "CPU", "MEM", "LAST OUTPUT")
_RIGHT = {"STEP", "STEPS/S", "LOSS", "CPU", "MEM"}
_CSI = re.compile(r"\x1b\[[0-9;?]*([A-Za-z])|\x1b[^\[]")

Segment = tuple[str, str | None]  # (text, SGR code or None)


# ------------------------------------------------------------------ formatting


def format_duration(seconds: float) -> str:
    """42.1 s, 3m 05s, 1h 02m."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    return f"{minutes // 60}h {minutes % 60:02d}m"


def _clock_text(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else \
        f"{minutes}:{secs:02d}"


def _ago(seconds: float) -> str:
    if seconds < 1:
        return "now"
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s ago"
    return f"{minutes // 60}h{minutes % 60:02d}m ago"


def _rate(rate: float) -> str:
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2f}"


def _mem(mb: float) -> str:
    return f"{mb:.0f} MB" if mb < 1024 else f"{mb / 1024:.1f} GB"


def _cells(row: TaskRow) -> list[str]:
    done = row.state in _DONE or row.state == "pending"
    dash = "-"
    return [
        row.host,
        row.task,
        row.state if row.slowdown is None else f"{row.state} (straggler {row.slowdown:.2g}x)",
        dash if row.step is None else str(row.step),
        dash if done or row.steps_per_s is None else _rate(row.steps_per_s),
        dash if row.loss is None else f"{row.loss:.4g}",
        dash if done or row.cpu_percent is None else f"{row.cpu_percent:.0f}%",
        dash if done or row.rss_mb is None else _mem(row.rss_mb),
        dash if done or row.silent_s is None else _ago(row.silent_s),
    ]


def describe_row(row: TaskRow) -> str:
    """One task's status in words, for plain (non-terminal) output."""
    host, task, state, step, rate, loss, cpu, mem, ago = _cells(row)
    parts = [f"{row.label} {state}"]
    if row.step is not None:
        parts.append(f"step {step}" + (f" ({rate} steps/s)" if rate != "-" else ""))
    if loss != "-":
        parts.append(f"loss {loss}")
    if cpu != "-":
        parts.append(f"cpu {cpu}")
    if mem != "-":
        parts.append(mem)
    if ago != "-":
        parts.append(f"last output {ago}")
    return ", ".join(parts)


def state_counts(rows: Sequence[TaskRow]) -> str:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state] = counts.get(row.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in counts.items())


# ------------------------------------------------------------------- rendering


def _line(segments: Sequence[Segment], width: int, colour: bool) -> str:
    """Join segments, cut to `width` visible characters, colour if asked."""
    out, left = [], width
    for text, style in segments:
        if left <= 0:
            break
        text = text[:left]
        left -= len(text)
        out.append(f"\x1b[{style}m{text}\x1b[0m" if colour and style and text else text)
    return "".join(out).rstrip() if not colour else "".join(out)


def _pick(rows: Sequence[TaskRow], room: int) -> tuple[list[TaskRow], int]:
    """At most `room` rows, those needing attention first, in their own order."""
    if len(rows) <= room:
        return list(rows), 0
    room = max(1, room - 1)  # one line says how many are hidden
    urgent = [i for i, r in enumerate(rows) if r.state in _ATTENTION]
    others = [i for i, r in enumerate(rows) if r.state not in _ATTENTION]
    chosen = sorted((urgent + others)[:room])
    return [rows[i] for i in chosen], len(rows) - len(chosen)


def render(rows: Sequence[TaskRow], *, width: int, height: int, elapsed_s: float,
           colour: bool, label_style: Mapping[str, str] | None = None,
           rule: str = "─", goodput: str = "") -> list[str]:
    """The status table as screen lines, none wider than `width - 1` and at
    most `height - 1` of them (one line stays free for the scrolling logs).
    `goodput`: the title's last words (`goodput 91 %`), when known."""
    width = max(1, width - 1)  # a full-width line may wrap on some terminals
    label_style = label_style or {}
    first = rows[0] if rows else None
    title = f" mgpu-launch {_clock_text(elapsed_s)} "
    if first is not None:
        restarts = f"{first.restarts} restart{'s' if first.restarts != 1 else ''}"
        title += f"{rule} generation {first.generation} ({restarts}) {rule} {state_counts(rows)} "
    if goodput:
        title += f"{rule} {goodput} "
    header = _line([(rule + title + rule * width, "1")], width, colour)
    if height < 5 or width < 30 or not rows:
        return [header]
    shown, hidden = _pick(rows, height - 3)
    table = [list(COLUMNS)] + [_cells(r) for r in shown]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = [header]
    for n, cells in enumerate(table):
        row = shown[n - 1] if n else None
        segments: list[Segment] = []
        for i, (name, text) in enumerate(zip(COLUMNS, cells, strict=True)):
            text = text.rjust(widths[i]) if name in _RIGHT else text.ljust(widths[i])
            segments.append((text, _style(name, row)))
            segments.append(("  ", None))
        if row is not None and row.label in label_style:
            segments[0] = (segments[0][0], label_style[row.label])
            segments[2] = (segments[2][0], label_style[row.label])
        lines.append(_line(segments[:-1], width, colour))
    if hidden:
        rest = [r for r in rows if r not in shown]
        lines.append(_line([(f"... {hidden} more: {state_counts(rest)}", "2")], width, colour))
    return lines


def _style(column: str, row: TaskRow | None) -> str | None:
    if row is None:
        return "2"  # column titles
    if column == "STATE":
        return _STATE_STYLE.get(row.state)
    if column == "LAST OUTPUT" and row.state == "running" and \
            (row.silent_s or 0) >= QUIET_WARN_S:
        return "33"
    return None


def clean_for_screen(text: str, colour: bool) -> str:
    """A task's line made safe above the table: cursor movements and erases
    would corrupt it, so only colours survive (and are reset at the end)."""
    if "\r" in text:  # a progress bar redrawn in place: keep what a terminal would show
        text = next((part for part in reversed(text.split("\r")) if part), "")
    if "\x1b" not in text:
        return text
    kept = _CSI.sub(lambda m: m.group(0) if colour and m.group(1) == "m" else "", text)
    return kept + "\x1b[0m" if colour and "\x1b" in kept else kept


# ---------------------------------------------------------------------- screen


def goodput_title(ledger: Mapping[str, Any] | None) -> str:
    """The title's goodput words (`goodput 91 %`) of a goodput ledger
    (job/record/goodput.py), or "" before the first step: the launcher's own table and
    `status --watch` both say it so."""
    if not ledger or not ledger.get("wall_s") or not ledger.get("productive_s"):
        return ""
    return f"goodput {100 * float(ledger['productive_s']) / float(ledger['wall_s']):.0f} %"
