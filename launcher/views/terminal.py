"""A run's terminal lines, in text: the launcher's own label, the tasks'
colours, the padded `host0/worker0 |` prefix, whether a stream gets colour and
a live table, and the words for lines the terminal did not take.

A rendering only: the writer thread that puts these lines on the terminal is
launcher/outlets/printer.py's (the live table is launcher/views/live.py's).

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import os
from typing import TextIO

COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")
LAUNCHER = "mgpu-launch"


def wants_colour(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def wants_live(stream: TextIO) -> bool:
    """A table redrawn in place needs a terminal that moves its cursor."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def prefix(label: str, width: int, code: str | None, colour: bool) -> str:
    """`label |` padded to `width`, in colour `code` when colour is on."""
    text = f"{label:<{width}} |"
    return f"\x1b[{code}m{text}\x1b[0m" if colour and code else text


def gap_words(count: int) -> str:
    """Where task lines were dropped, said in place of them."""
    return (f"... {count} lines of task output not shown here: the terminal did not keep up "
            "(the log files have every line)")


def dropped_words(count: int) -> str:
    """The run's last notice when the terminal did not take every line."""
    return (f"{count} lines of task output were not shown: the terminal did not keep up "
            "(the log files have every line)")
