"""Static SVG charts for `mgpu-launch report`: a timeline, a line chart, a stacked bar.

Pure functions from values to SVG text (no I/O, no launcher import): the
report needs three simple charts drawn the same way every time, in a file
that opens from disk with no network. A plotting library would be a heavy
dependency of the launcher's machine for that (matplotlib pulls numpy,
pillow, fonttools and more, and draws fonts into paths or needs them at view
time); these few shapes are easier to test as text than as pictures.

Every text that comes from outside goes through `esc` (task names, messages):
an SVG inlined in HTML is markup, and a run's words must stay words.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

# The states of a task's timeline and their colours (the legend's order).
STATE_COLORS = {
    "starting": "#9aa5b1",
    "joining": "#e0b341",
    "training": "#3c9a5f",
    "serving": "#2f6fd1",
    "stopping": "#e58a3a",
    "failed": "#d64545",
    "restarting": "#7a6fd0",
}
# Line colours, one per series, in turn.
PALETTE = ("#2f6fd1", "#d1552f", "#3c9a5f", "#9b4dca", "#c7a020", "#2aa1a8", "#b03a78",
           "#6b7a2f")
FONT = 'font-family="DejaVu Sans, Arial, sans-serif" font-size="11"'


def esc(text: object) -> str:
    """`text` safe inside markup and attribute values."""
    return html.escape(str(text), quote=True)


def num(value: float) -> str:
    """A coordinate, short: 12.5, 3, never 1e-05."""
    return f"{value:.1f}".rstrip("0").rstrip(".") if math.isfinite(value) else "0"


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else [0.0]
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


@dataclass(frozen=True)
class Span:
    """A stretch of one row of a timeline in one state."""

    row: int
    start: float  # seconds from the chart's origin
    end: float
    state: str  # a key of STATE_COLORS
    title: str = ""  # shown on hover


@dataclass(frozen=True)
class Mark:
    """A moment on one row: a fault, numbered to match the list under the chart."""

    row: int
    t: float
    label: str  # short: "1"
    title: str = ""
    color: str = "#d64545"  # a fault's red; the loss's marks (a NaN, a spike) their own


@dataclass(frozen=True)
class Scale:
    """Seconds to x pixels."""

    t0: float
    t1: float
    left: float
    right: float

    def x(self, t: float) -> float:
        span = self.t1 - self.t0 or 1.0
        t = min(max(t, self.t0), self.t1)
        return self.left + (t - self.t0) / span * (self.right - self.left)


def _axis(scale: Scale, y: float, top: float) -> list[str]:
    """Time ticks along `y`, with faint grid lines up to `top`."""
    out = [f'<line x1="{num(scale.left)}" y1="{num(y)}" x2="{num(scale.right)}" '
           f'y2="{num(y)}" stroke="#555"/>']
    for tick in nice_ticks(scale.t0, scale.t1):
        x = num(scale.x(tick))
        out.append(f'<line x1="{x}" y1="{num(top)}" x2="{x}" y2="{num(y)}" stroke="#e3e3e3"/>')
        out.append(f'<text x="{x}" y="{num(y + 14)}" text-anchor="middle">{num(tick)} s</text>')
    return out


def timeline(rows: Sequence[str], spans: Sequence[Span], marks: Sequence[Mark],
             t1: float, width: int = 960, row_h: int = 22) -> str:
    """One row per name in `rows`: coloured spans by state over [0, t1] seconds,
    faults as numbered red marks, a time axis and a legend below."""
    label_w = min(260, 14 + 7 * max((len(r) for r in rows), default=4))
    scale = Scale(0.0, max(t1, 1e-3), label_w, width - 12)
    top = 8
    axis_y = top + row_h * len(rows) + 4
    height = axis_y + 44
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {FONT} role="img">']
    for i, name in enumerate(rows):
        y = top + i * row_h
        fill = "#f6f7f9" if i % 2 == 0 else "#ffffff"
        out.append(f'<rect x="0" y="{y}" width="{width}" height="{row_h}" fill="{fill}"/>')
        out.append(f'<text x="6" y="{num(y + row_h / 2 + 4)}">{esc(name)}</text>')
    for span in spans:
        x0, x1 = scale.x(span.start), scale.x(span.end)
        y = top + span.row * row_h + 4
        color = STATE_COLORS.get(span.state, "#cccccc")
        out.append(f'<rect x="{num(x0)}" y="{y}" width="{num(max(1.0, x1 - x0))}" '
                   f'height="{row_h - 8}" fill="{color}"><title>{esc(span.title or span.state)}'
                   '</title></rect>')
    out += _axis(scale, axis_y, top)
    for mark in marks:
        x, y = scale.x(mark.t), top + mark.row * row_h + row_h / 2
        out.append(f'<g><title>{esc(mark.title)}</title>'
                   f'<circle cx="{num(x)}" cy="{num(y)}" r="8" fill="{esc(mark.color)}" '
                   'stroke="#fff"/>'
                   f'<text x="{num(x)}" y="{num(y + 4)}" text-anchor="middle" fill="#fff" '
                   f'font-weight="bold">{esc(mark.label)}</text></g>')
    out += _legend(list(STATE_COLORS.items()), label_w, axis_y + 24)
    out.append("</svg>")
    return "\n".join(out)


def _legend(items: Sequence[tuple[str, str]], x: float, y: float) -> list[str]:
    out = []
    for name, color in items:
        out.append(f'<rect x="{num(x)}" y="{num(y)}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{num(x + 16)}" y="{num(y + 10)}">{esc(name)}</text>')
        x += 28 + 7 * len(name)
    return out


def line_chart(series: dict[str, Sequence[Sequence[tuple[float, float]]]], t1: float,
               y_label: str, marks: Sequence[float] = (), width: int = 960,
               height: int = 260) -> str:
    """A line per series over [0, t1], y from 0. A series is name -> its pieces,
    each [(seconds, value), ...], drawn apart (a restart is a gap, not a slope);
    `marks`: moments drawn as dashed red lines (the faults)."""
    left, top, bottom = 56, 10, height - 48
    scale = Scale(0.0, max(t1, 1e-3), left, width - 12)
    values = [v for pieces in series.values() for piece in pieces for _, v in piece]
    peak = max(values, default=1.0)
    y_ticks = nice_ticks(0.0, peak if peak > 0 else 1.0, 5)
    y_max = max(y_ticks[-1], peak) or 1.0

    def y(value: float) -> float:
        return bottom - max(0.0, value) / y_max * (bottom - top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {FONT} role="img">']
    for tick in y_ticks:
        out.append(f'<line x1="{left}" y1="{num(y(tick))}" x2="{width - 12}" '
                   f'y2="{num(y(tick))}" stroke="#eeeeee"/>')
        out.append(f'<text x="{left - 4}" y="{num(y(tick) + 4)}" text-anchor="end">'
                   f'{num(tick)}</text>')
    middle = num((top + bottom) / 2)
    out.append(f'<text x="12" y="{middle}" transform="rotate(-90 12 {middle})" '
               f'text-anchor="middle">{esc(y_label)}</text>')
    out += _axis(scale, bottom, top)
    for t in marks:
        x = num(scale.x(t))
        out.append(f'<line x1="{x}" y1="{top}" x2="{x}" y2="{bottom}" stroke="#d64545" '
                   'stroke-dasharray="4 3"/>')
    legend = []
    for i, (name, pieces) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        legend.append((name, color))
        out += _pieces(pieces, color, name, scale, y)
    out += _legend(legend, left, bottom + 26)
    out.append("</svg>")
    return "\n".join(out)


def _pieces(pieces: Sequence[Sequence[tuple[float, float]]], color: str, name: str,
            scale: Scale, y) -> list[str]:
    out = []
    drawn = [p for p in pieces if p]
    if drawn:
        path = " ".join("M " + " L ".join(f"{num(scale.x(t))},{num(y(v))}" for t, v in piece)
                        for piece in drawn)
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2">'
                   f'<title>{esc(name)}</title></path>')
    dots = [point for piece in drawn for point in piece]
    for t, v in dots if len(dots) <= 80 else ():
        out.append(f'<circle cx="{num(scale.x(t))}" cy="{num(y(v))}" r="2.5" fill="{color}"/>')
    return out


def stacked_bar(parts: Sequence[tuple[str, float, str]], width: int = 960,
                height: int = 34) -> str:
    """One bar split into (name, value, colour) parts in proportion; each part
    titled with its value; parts too thin for a label keep only the title."""
    total = sum(max(0.0, v) for _, v, _ in parts) or 1.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" {FONT} role="img">']
    x = 0.0
    for name, value, color in parts:
        w = max(0.0, value) / total * width
        if w <= 0:
            continue
        share = 100.0 * max(0.0, value) / total
        out.append(f'<rect x="{num(x)}" y="0" width="{num(w)}" height="{height}" '
                   f'fill="{color}"><title>{esc(name)}: {value:.1f} s ({share:.0f} %)'
                   '</title></rect>')
        if w > 7 * (len(name) + 6):
            out.append(f'<text x="{num(x + 5)}" y="{num(height / 2 + 4)}" fill="#fff">'
                       f'{esc(name)} {share:.0f} %</text>')
        x += w
    out.append("</svg>")
    return "\n".join(out)
