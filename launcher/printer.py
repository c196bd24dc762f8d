"""All terminal output of a run: task lines with a padded host/task prefix,
launcher notices, and the live status table on a terminal.

Owned by the supervisor thread. Two modes, chosen once:
- plain (not a terminal, `TERM=dumb`, or `live=False`): prefixed lines only,
  exactly `host0/worker0 | text`, no escape codes (colour only on a TTY
  without NO_COLOR);
- live (a terminal): the same lines scroll above a table of every task,
  redrawn in place by `live.LiveScreen` from the supervisor's snapshots.

`quiet` drops task lines (they still go to the log files); `verbose` adds
launcher detail: task state changes, `debug()` lines, and in plain mode a
status line per task every `STATUS_EVERY_S`.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from .live import LiveScreen, clean_for_screen, describe_row
from .states import TaskRow

_COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")
LAUNCHER = "mgpu-launch"
# Plain --verbose output: how often every task's status is printed as a line.
STATUS_EVERY_S = 10.0


def wants_colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def wants_live(stream: TextIO) -> bool:
    """A table redrawn in place needs a terminal that moves its cursor."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


class Printer:
    def __init__(self, labels: Sequence[str], stream: TextIO | None = None,
                 colour: bool | None = None, quiet: bool = False, live: bool | None = None,
                 verbose: bool = False, clock: Callable[[], float] = time.monotonic,
                 size: Callable[[], tuple[int, int]] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.colour = wants_colour(self.stream) if colour is None else colour
        self.quiet = quiet
        self.verbose = verbose
        self._clock = clock
        self._width = max([len(LAUNCHER), *(len(label) for label in labels)])
        self._colour_of = {label: _COLOURS[i % len(_COLOURS)] for i, label in enumerate(labels)}
        if wants_live(self.stream) if live is None else live:
            self._screen: LiveScreen | None = LiveScreen(
                self.stream, self.colour, self._colour_of, clock=clock, size=size)
        else:
            self._screen = None
        self._states: dict[str, str] = {}
        self._next_status = clock() + STATUS_EVERY_S

    @property
    def live(self) -> bool:
        return self._screen is not None

    def _prefix(self, label: str, code: str | None) -> str:
        text = f"{label:<{self._width}} |"
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text

    def _write(self, lines: list[str]) -> None:
        if self._screen is not None:
            self._screen.print_lines(lines)
            return
        self.stream.write("".join(f"{line}\n" for line in lines))
        self.stream.flush()

    def task_line(self, label: str, text: str) -> None:
        if self.quiet:
            return
        if self._screen is not None:
            text = clean_for_screen(text, self.colour)
        self._write([f"{self._prefix(label, self._colour_of.get(label, '37'))} {text}"])

    def notice(self, text: str) -> None:
        """A line from the launcher itself (always shown)."""
        self._write([f"{self._prefix(LAUNCHER, '1')} {line}" for line in text.splitlines() or [""]])

    def debug(self, text: str) -> None:
        """Launcher detail shown only with --verbose."""
        if self.verbose:
            self._write([f"{self._prefix(LAUNCHER, '2')} {line}"
                         for line in text.splitlines() or [""]])

    def refresh(self, rows: Sequence[TaskRow]) -> None:
        """Called by the supervisor a few times a second with `TaskRow`s."""
        if self.verbose:
            self._report_changes(rows)
        if self._screen is not None:
            self._screen.show(rows)
        elif self.verbose and rows and self._clock() >= self._next_status:
            self._next_status = self._clock() + STATUS_EVERY_S
            self.debug("\n".join(describe_row(row) for row in rows))

    def _report_changes(self, rows: Sequence[TaskRow]) -> None:
        changes = []
        for row in rows:
            key = f"{row.label} generation {row.generation}"
            before = self._states.get(row.label)
            if before != f"{row.generation}:{row.state}":
                was = before.split(":", 1)[1] if before and before.startswith(
                    f"{row.generation}:") else None
                changes.append(f"{key}: {was} -> {row.state}" if was else f"{key}: {row.state}")
                self._states[row.label] = f"{row.generation}:{row.state}"
        if changes:
            self.debug("\n".join(changes))

    def close(self) -> None:
        """End of the run: take the live table off the terminal; anything
        printed afterwards (the summary) comes as plain prefixed lines."""
        if self._screen is not None:
            self._screen.close()
            self._screen = None
