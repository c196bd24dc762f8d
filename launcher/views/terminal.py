"""A run's terminal lines, in text: the launcher's own label, the tasks'
colours, the padded `host0/worker0 |` prefix, and the words for lines the
terminal did not take.

A rendering only: the writer thread that puts these lines on the terminal is
launcher/outlets/printer.py's (the live table is launcher/views/live.py's;
whether a stream gets colour and a live table, launcher/outlets/screen.py's).

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

COLOURS = ("36", "33", "35", "32", "34", "91", "96", "93")
LAUNCHER = "mgpu-launch"


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
