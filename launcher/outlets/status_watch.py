"""`mgpu-launch status RUN_DIR --watch`: the live table of a job that another
launcher runs (detached, or started on another machine with a shared run
directory), redrawn from its run directory until the job ends.

It reads events.jsonl as it grows (only the new bytes, every `POLL_S`), folds it
into the run's model (`launcher.job.record.story.Story`: the supervisor's own task
state machine, the goodput ledger) and draws it with the launch's own view:
`screen.LiveScreen` on a terminal (the launcher's notices scrolling above the
table, in launcher/views/narrate.py's words), on anything else (or a terminal that
reports a size of 0) a plain line per notice and per task state change. It ends
when summary.json appears (then prints `status`), or when the launcher is known
to be gone without one, and returns the run as it ended; the command
(launcher/commands/status.py) makes the exit code: 0 the job succeeded, 1 it
did not (failed, interrupted, aborted), 2 not a run directory, 130 Ctrl-C.

The polling loop is this outlet's; the table, the notices' words and the status
are the views' (live, narrate, records). Read-only. Must not import
supervisor, transport or cli.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..job.record import eventlines
from ..job.record.story import Story, TaskRow, records
from ..spec.rundir import EVENTS, SUMMARY
from ..views import narrate
from ..views.live import describe_row, goodput_title
from ..views.records import RunView, render_status
from ..views.terminal import LAUNCHER
from .rundir import launcher_alive, load_run, read_launcher_pid
from .screen import LiveScreen, sized, wants_colour, wants_live

POLL_S = 0.5
# How often the launcher's process is looked for (a launcher gone without a summary).
ALIVE_EVERY_S = 2.0


class EventTail:
    """The complete lines added to events.jsonl since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return list(records(lines))


class _Plain:
    """Not a terminal: a line per notice, and per task whose state moved."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._states: dict[str, str] = {}

    def show(self, rows: list[TaskRow], notices: list[str]) -> None:
        lines = list(notices)
        for row in rows:
            key = f"{row.generation}:{row.state}"
            if self._states.get(row.label) != key:
                self._states[row.label] = key
                lines.append(f"{LAUNCHER} | generation {row.generation}: {describe_row(row)}")
        if lines:
            self.out.write("".join(f"{line}\n" for line in lines))
            self.out.flush()

    def close(self) -> None:
        pass


class _Live:
    """A terminal: the launch's own table, notices scrolling above it, the
    goodput so far in its title (as the launcher's own)."""

    def __init__(self, out: TextIO, started: float | None, story: Story) -> None:
        self._screen = LiveScreen(out, wants_colour(out), clock=time.time, started=started)
        self._story = story

    def show(self, rows: list[TaskRow], notices: list[str]) -> None:
        self._screen.goodput = goodput_title(self._story.goodput(time.time()))
        self._screen.show(rows)
        if notices:
            self._screen.print_lines(notices)

    def close(self) -> None:
        self._screen.close()


def watch(run_dir: Path, out: TextIO, live: bool | None = None, poll_s: float = POLL_S,
          alive: Callable[[dict[str, Any]], bool | None] = launcher_alive) -> RunView | None:
    """Redraw the run's table until it ends, then print its status: the run as
    it ended (None: interrupted first, Ctrl-C). Raises records.RunDirError."""
    load_run(run_dir, alive=lambda _launch: None)  # a run directory, or RunDirError
    tail = EventTail(run_dir / EVENTS)
    state = Story()
    view: _Plain | _Live | None = None
    next_alive = time.monotonic() + ALIVE_EVERY_S
    gone = False
    try:
        while True:
            finished = (run_dir / SUMMARY).exists()  # before the last read: nothing missed
            notices = _feed(state, tail.read())
            if view is None:
                live_now = wants_live(out) and sized(out) if live is None else live
                view = _Live(out, state.started_t, state) if live_now else _Plain(out)
            view.show(state.rows(time.time()), notices)
            if finished or gone:
                break
            if time.monotonic() >= next_alive:
                next_alive = time.monotonic() + ALIVE_EVERY_S
                launcher = state.first_launch or read_launcher_pid(run_dir)
                gone = launcher is not None and alive(launcher) is False
                if gone:
                    continue  # one more read: what it wrote before it went
            time.sleep(poll_s)
    except KeyboardInterrupt:
        if view is not None:
            view.close()
        return None
    view.close()
    final = load_run(run_dir, alive=alive)
    out.write(render_status(final) + "\n")
    out.flush()
    return final


def _feed(state: Story, records: list[dict[str, Any]]) -> list[str]:
    """The records folded into the story; the notices they make, in words."""
    notices = []
    for record in records:
        event = eventlines.from_record(record)
        state.tell(event)
        said = narrate.line(event)
        if said is not None and said[0] == "notice":
            notices.append(f"{LAUNCHER} | {said[1]}")
    return notices
