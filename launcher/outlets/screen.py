"""The bottom of the terminal: the live table (launcher/views/live.py renders
it), redrawn in place, log lines scrolling above it.

`LiveScreen` owns the bottom of the terminal: to print a log line it moves the
cursor up over the table, erases to the end of the screen, writes the line and
draws the table again, all in one write, so the lines scroll above a table
that stays put. Plain ANSI (cursor up, erase below, SGR colours): no
redirection of stdout; only the printer's writer thread (outlets/printer.py)
and `status --watch` (outlets/status_watch.py) call it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from ..job.record.story import TaskRow
from ..views.live import render


def wants_colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def wants_live(stream: TextIO) -> bool:
    """A table redrawn in place needs a terminal that moves its cursor."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def sized(stream: TextIO) -> bool:
    """False for a terminal that reports a size of 0 (`script -qfc`, some CI
    consoles): a table cut to that size is a lone rule; plain lines show more."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return True  # unknown: terminal_size's 80 x 24
    return size.columns > 0 and size.lines > 0


def terminal_size(stream: TextIO) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(stream.fileno())
        return size.columns, size.lines
    except (OSError, ValueError, AttributeError):
        return 80, 24


class LiveScreen:
    """The table at the bottom of the terminal, log lines scrolling above it."""

    def __init__(self, stream: TextIO, colour: bool,
                 label_style: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 size: Callable[[], tuple[int, int]] | None = None,
                 emit: Callable[[str], None] | None = None,
                 started: float | None = None) -> None:
        self.stream = stream
        self._write = emit  # how text reaches the terminal (default: stream.write)
        self.colour = colour
        self._label_style = dict(label_style or {})
        self._clock = clock
        self._started = clock() if started is None else started  # the title's clock starts
        self._size = size or (lambda: terminal_size(stream))
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        self._rule = "─" if encoding.startswith("utf") else "-"
        self._rows: list[TaskRow] = []
        self._drawn = 0  # lines of table now on screen, just above the cursor
        self._table: list[str] = []
        self.goodput = ""  # the title's goodput words (set by the printer)

    def _erase(self) -> str:
        # Up over the table, back to column 0, erase everything below.
        return f"\x1b[{self._drawn}A\r\x1b[J" if self._drawn else ""

    def _render(self) -> list[str]:
        width, height = self._size()
        return render(self._rows, width=width, height=height,
                      elapsed_s=self._clock() - self._started, colour=self.colour,
                      label_style=self._label_style, rule=self._rule, goodput=self.goodput)

    def _emit(self, text: str) -> None:
        if self._write is not None:
            self._write(text)
            return
        self.stream.write(text)
        self.stream.flush()

    def show(self, rows: Sequence[TaskRow]) -> None:
        """A new snapshot: redraw the table (only if it looks different)."""
        self._rows = list(rows)
        table = self._render()
        if table == self._table and self._drawn:
            return
        self._emit(self._erase() + "".join(f"{line}\n" for line in table))
        self._table, self._drawn = table, len(table)

    def print_lines(self, lines: Sequence[str]) -> None:
        """Lines that scroll above the table (the table is drawn again under them)."""
        body = "".join(f"{line}\n" for line in lines)
        if not self._drawn:
            self._emit(body)
            return
        self._emit(self._erase() + body + "".join(f"{line}\n" for line in self._table))

    def close(self) -> None:
        """Take the table off the screen; what follows prints as plain lines."""
        self._emit(self._erase())
        self._drawn, self._table = 0, []
