"""All terminal output of a run: task lines with a padded host/task prefix,
launcher notices, and the live status table on a terminal.

Called by the supervisor thread, which must never wait on the terminal: a
stalled stdout (Ctrl-S, `| less`, a pipe nobody reads) would otherwise hold
up failure handling and Ctrl-C. So the public methods only format a line and
put it in a bounded buffer; a writer thread of the printer's own does every
write (and every redraw of the live table). When the terminal cannot keep
up, task lines are dropped (the log files, written by the supervisor's
RunRecorder, still get every line) and one line says how many, where they
went missing. A terminal that is gone (EPIPE, EIO, a closed file, SIGHUP)
is never written to again: `terminal_lost` says why.

Two modes, chosen once:
- plain (not a terminal, `TERM=dumb`, or `live=False`): prefixed lines only,
  exactly `host0/worker0 | text`, no escape codes (colour only on a TTY
  without NO_COLOR);
- live (a terminal): the same lines scroll above a table of every task,
  redrawn in place by `screen.LiveScreen` from the supervisor's snapshots.

`quiet` drops task lines (they still go to the log files); `verbose` adds
launcher detail: task state changes, `debug()` lines, and in plain mode a
status line per task every `STATUS_EVERY_S`.

The words are the views': each event's line (launcher/views/narrate.py), the
prefixes and colours (launcher/views/terminal.py), the live table
(launcher/views/live.py); this outlet owns the buffer and the writer thread.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import errno
import io
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from ..job.record.events import Event
from ..job.record.story import Beside, Story, TaskRow
from ..views import narrate
from ..views.live import clean_for_screen, describe_row, goodput_title
from ..views.terminal import (
    COLOURS,
    LAUNCHER,
    dropped_words,
    gap_words,
    prefix,
)
from .screen import LiveScreen, wants_colour, wants_live

# Plain --verbose output: how often every task's status is printed as a line.
STATUS_EVERY_S = 10.0
GOODPUT_EVERY_S = 5.0  # the live title's goodput, worked out this often
# Lines waiting for the terminal; beyond this, task lines are dropped.
BUFFER_LINES = 2000
# Launcher notices are few and matter more: they are dropped only beyond this.
HARD_LIMIT_LINES = 4 * BUFFER_LINES
# How long close() waits for the terminal to take what is queued.
CLOSE_WAIT_S = 3.0
# Lines joined into one write (one redraw of the live table).
BATCH_LINES = 500


class _Sink:
    """Writes text to the stream. A stream with a file descriptor is written
    with os.write: a writer thread blocked on a stalled terminal then holds no
    lock of Python's buffered stdout, which the interpreter needs at exit."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"
        self.fd: int | None
        try:
            self.fd = stream.fileno()
            stream.flush()  # whatever print() left in Python's buffer goes first
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            self.fd = None

    def write(self, text: str) -> None:
        if self.fd is None:
            self.stream.write(text)
            self.stream.flush()
            return
        data = memoryview(text.encode(self.encoding, "replace"))
        while data:
            try:
                data = data[os.write(self.fd, data):]
            except BlockingIOError:  # stdout left non-blocking by whoever started us: full
                select.select([], [self.fd], [], 1.0)


@dataclass
class _Gap:
    """Where task lines were dropped, and how many."""

    count: int = 0


_CLOSE_SCREEN = object()  # queued by close(): take the live table off


class Printer:
    def __init__(self, labels: Sequence[str], stream: TextIO | None = None,
                 colour: bool | None = None, quiet: bool = False, live: bool | None = None,
                 verbose: bool = False, clock: Callable[[], float] = time.monotonic,
                 size: Callable[[], tuple[int, int]] | None = None,
                 buffer_lines: int = BUFFER_LINES,
                 on_terminal_lost: Callable[[str], None] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.colour = wants_colour(self.stream) if colour is None else colour
        self.quiet = quiet
        self.verbose = verbose
        self._clock = clock
        self._width = max([len(LAUNCHER), *(len(label) for label in labels)])
        self._colour_of = {label: COLOURS[i % len(COLOURS)] for i, label in enumerate(labels)}
        self._sink = _Sink(self.stream)
        self._live = bool(wants_live(self.stream) if live is None else live)
        # Owned by the writer thread from here on.
        self._screen: LiveScreen | None = LiveScreen(
            self.stream, self.colour, self._colour_of, clock=clock, size=size,
            emit=self._sink.write) if self._live else None
        self._states: dict[str, str] = {}
        self._next_status = clock() + STATUS_EVERY_S
        # The run folded: the table's figures and the title's goodput. Told from the
        # supervisor thread, and from a view's own thread for its events (Job._record).
        self._story = Story()
        self._story_lock = threading.Lock()
        self._next_goodput = 0.0
        # Shared between the callers and the writer thread, under _cond.
        self._cond = threading.Condition()
        self._queue: deque[str | _Gap | object] = deque()
        self._rows: list[TaskRow] | None = None  # the newest snapshot not drawn yet
        self._queued = 0  # lines in _queue
        self._taken = 0  # items taken off the queue (by the writer, or dropped)
        self._written = 0  # ...and done with (for flush)
        self._busy = False
        self._stopping = False
        self._abandoned = False  # close() gave up on a stalled terminal
        self._closed = False
        self.dropped = 0  # lines never shown, in all
        self._buffer_lines = buffer_lines
        self._on_lost = on_terminal_lost
        self.terminal_lost: str | None = None  # why the terminal is gone (EPIPE, EIO, SIGHUP...)
        self.terminal_lost_t: float | None = None  # when (Unix time)
        self._writer = threading.Thread(target=self._write_loop, name="printer", daemon=True)
        self._writer.start()

    @property
    def live(self) -> bool:
        return self._live and not self._closed

    def _prefix(self, label: str, code: str | None) -> str:
        return prefix(label, self._width, code, self.colour)

    # ------------------------------------------------------- callers' side

    def _put(self, lines: list[str], droppable: bool) -> None:
        with self._cond:
            if self.terminal_lost is not None or self._abandoned:
                self.dropped += len(lines)
                return
            limit = self._buffer_lines if droppable else HARD_LIMIT_LINES
            if self._queued + len(lines) > limit:
                self.dropped += len(lines)
                last = self._queue[-1] if self._queue else None
                if isinstance(last, _Gap):
                    last.count += len(lines)
                else:
                    self._queue.append(_Gap(len(lines)))
                self._cond.notify()
                return
            self._queue.extend(lines)
            self._queued += len(lines)
            self._cond.notify()

    def task_line(self, label: str, text: str) -> None:
        if self.quiet:
            return
        if self._live:
            text = clean_for_screen(text, self.colour)
        self._put([f"{self._prefix(label, self._colour_of.get(label, '37'))} {text}"], True)

    def notice(self, text: str) -> None:
        """A line from the launcher itself (always shown)."""
        self._put([f"{self._prefix(LAUNCHER, '1')} {line}"
                   for line in text.splitlines() or [""]], False)

    def tell(self, event: Event) -> None:
        """An event of the run, in the words of launcher/views/narrate.py (if any),
        folded into the run's model (the table's steps, rates, losses, goodput)."""
        with self._story_lock:
            self._story.tell(event, time.time())
        said = narrate.line(event)
        if said is not None:
            level, text = said
            (self.notice if level == "notice" else self.debug)(text)

    def debug(self, text: str) -> None:
        """Launcher detail shown only with --verbose."""
        if self.verbose:
            self._put([f"{self._prefix(LAUNCHER, '2')} {line}"
                       for line in text.splitlines() or [""]], False)

    def refresh(self, beside: Sequence[Beside]) -> None:
        """Called by the supervisor a few times a second with what it alone knows
        of the tasks (CPU, memory, silence): the table is the run's model (its
        states too, from the events told), those figures beside."""
        with self._story_lock:
            rows = self._story.rows(time.time(), beside=beside)
        if self.verbose:
            self._report_changes(rows)
        if self.live and self.terminal_lost is None:
            self._title_goodput()
            with self._cond:  # only the newest snapshot is ever drawn
                self._rows = list(rows)
                self._cond.notify()
        elif self.verbose and rows and self._clock() >= self._next_status:
            self._next_status = self._clock() + STATUS_EVERY_S
            self.debug("\n".join(describe_row(row) for row in rows))

    def _title_goodput(self) -> None:
        """`goodput 91 %` in the live table's title, worked out every GOODPUT_EVERY_S."""
        screen = self._screen  # the writer thread may drop it: keep the object
        if screen is None or self._clock() < self._next_goodput:
            return
        self._next_goodput = self._clock() + GOODPUT_EVERY_S
        with self._story_lock:
            ledger = self._story.goodput(time.time())
        screen.goodput = goodput_title(ledger) or screen.goodput

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

    def terminal_gone(self, reason: str) -> None:
        """Never write to the terminal again (e.g. on SIGHUP). Takes no lock:
        safe in a signal handler; the writer checks the flag before each write."""
        if self.terminal_lost is None:
            self.terminal_lost, self.terminal_lost_t = reason, time.time()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued so far was written (or dropped);
        False when the terminal did not take it within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._taken + len(self._queue)
            while (self._written < target or self._busy or self._rows is not None) \
                    and self.terminal_lost is None and not self._abandoned \
                    and self._writer.is_alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float = CLOSE_WAIT_S) -> None:
        """End of the run: take the live table off the terminal; anything
        printed afterwards (the summary) comes as plain prefixed lines.
        Waits at most `timeout` for the terminal to take what is queued;
        a terminal that does not is given up on (later lines are dropped)."""
        if not self._closed:
            self._closed = True
            if self.dropped:
                self.notice(dropped_words(self.dropped))
            with self._cond:
                if self._live:
                    self._queue.append(_CLOSE_SCREEN)
                self._cond.notify()
        if not self.flush(timeout):
            with self._cond:
                self._abandoned = True
                self._drop_queue()

    def finish(self, timeout: float = CLOSE_WAIT_S) -> None:
        """After the last line: wait (bounded) for the terminal, stop the writer."""
        if not self._abandoned and not self.flush(timeout):
            self._abandoned = True
        with self._cond:
            self._stopping = True
            self._drop_queue()
            self._cond.notify()

    def _drop_queue(self) -> None:
        """Under _cond: forget what is queued (counted as dropped)."""
        self.dropped += self._queued
        self._taken += len(self._queue)
        self._written += len(self._queue)  # never to be written: as good as done
        self._queue.clear()
        self._queued = 0
        self._rows = None

    # ------------------------------------------------------- writer thread

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self._rows is None and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                rows, self._rows = self._rows, None
                batch: list[str | _Gap | object] = []
                while self._queue and len(batch) < BATCH_LINES:
                    item = self._queue.popleft()
                    batch.append(item)
                    if isinstance(item, str):
                        self._queued -= 1
                    if item is _CLOSE_SCREEN:
                        break
                self._taken += len(batch)
                self._busy = True
            try:
                self._emit(rows, batch)
            finally:
                with self._cond:
                    self._busy = False
                    self._written += len(batch)
                    self._cond.notify_all()

    def _emit(self, rows: list[TaskRow] | None, batch: list) -> None:
        lines = []
        for item in batch:
            if isinstance(item, _Gap):
                lines.append(f"{self._prefix(LAUNCHER, '33')} {gap_words(item.count)}")
            elif isinstance(item, str):
                lines.append(item)
        closing = bool(batch) and batch[-1] is _CLOSE_SCREEN
        if self.terminal_lost is not None or self._abandoned:
            return
        try:
            if self._screen is not None:
                if rows is not None:
                    self._screen.show(rows)
                if lines:
                    self._screen.print_lines(lines)
                if closing:
                    self._screen.close()
                    self._screen = None
            elif lines:
                self._sink.write("".join(f"{line}\n" for line in lines))
        except (OSError, ValueError) as exc:  # EPIPE, EIO, a closed file
            self._lost(_reason(exc))
        except Exception as exc:  # noqa: BLE001 - output must never take the run down
            self._lost(f"{type(exc).__name__}: {exc}")

    def _lost(self, reason: str) -> None:
        if self.terminal_lost is not None:
            return
        self.terminal_gone(reason)
        with self._cond:
            self._drop_queue()
        if self._on_lost is not None:
            try:
                self._on_lost(reason)
            except Exception:  # noqa: BLE001, S110 - a callback must not stop the writer
                pass


def _reason(exc: BaseException) -> str:
    """EPIPE, EIO... for an OSError; else the exception (a closed file: ValueError)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{type(exc).__name__}: {exc}"
