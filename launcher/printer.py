"""All terminal output of a run: task lines with a padded host/task prefix.

Owned by the supervisor thread. Colour only when the stream is a terminal (and
NO_COLOR is not set), so logs and pipes get plain text.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

_COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")
LAUNCHER = "mgpu-launch"


def wants_colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


class Printer:
    def __init__(self, labels: Sequence[str], stream: TextIO | None = None,
                 colour: bool | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.colour = wants_colour(self.stream) if colour is None else colour
        self.quiet = quiet
        self._width = max([len(LAUNCHER), *(len(label) for label in labels)])
        self._colour_of = {label: _COLOURS[i % len(_COLOURS)] for i, label in enumerate(labels)}

    def _prefix(self, label: str, code: str | None) -> str:
        text = f"{label:<{self._width}} |"
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text

    def task_line(self, label: str, text: str) -> None:
        if self.quiet:
            return
        self.stream.write(f"{self._prefix(label, self._colour_of.get(label, '37'))} {text}\n")
        self.stream.flush()

    def refresh(self, rows) -> None:
        """Called by the supervisor a few times a second with `TaskRow`s; plain
        output has no live view (see `live.py` for the terminal one)."""

    def close(self) -> None:
        """End of the run: release the terminal."""

    def notice(self, text: str) -> None:
        """A line from the launcher itself (always shown)."""
        for line in text.splitlines() or [""]:
            self.stream.write(f"{self._prefix(LAUNCHER, '1')} {line}\n")
        self.stream.flush()
