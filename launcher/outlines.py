"""A task's output cut into the lines the launcher shows and logs.

A line ends at "\\n" (or "\\r\\n"). A "\\r" alone ends a *segment* that the
next one overwrites on a terminal: a progress bar (Keras `fit(verbose=1)`,
tqdm) writes hundreds of them before its "\\n", and Keras erases each with
backspaces first. Joined, they made one line of many KiB that the 8 KiB cut
ended before the epoch's final numbers. Here only the last segment of such a
run is the line (the end-of-epoch loss and metrics); an overwritten segment
is passed on at most every OVERWRITTEN_EVERY_S, as a sign of life in a long
epoch. Backspaces are dropped. A line longer than `max_bytes` is cut, with a
marker saying how many bytes were cut; memory stays bounded by `max_bytes`
whatever the task writes.

Shipped with the agent (`python -S`): standard library only.
Must not import anything of the launcher.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

OVERWRITTEN_EVERY_S = 10.0  # one progress-bar state per this long reaches the log
_SEPARATOR = re.compile(rb"[\r\n]")


def cut_marker(more: int) -> str:
    return f" … [mgpu-launch: line cut, {more} more bytes]"


class LineSplitter:
    """Feed it bytes as they come (`feed`), then `close()`; each returns lines."""

    def __init__(self, max_bytes: int, overwritten_every_s: float = OVERWRITTEN_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_bytes
        self._every = overwritten_every_s
        self._clock = clock
        self._buf = bytearray()
        self._cut = 0  # bytes of the current segment beyond max_bytes, dropped
        self._pending_cr = False  # data ended with "\r": "\r\n" or an overwrite?
        self._segmented = False  # the current line had segments overwritten
        self._unsent = ""  # the last overwritten segment, not passed on
        self._last_sent = clock()

    def feed(self, data: bytes) -> list[str]:
        out: list[str] = []
        start, size = 0, len(data)
        if self._pending_cr and size:
            self._pending_cr = False
            if data[0] == 10:  # "\r\n" split across two reads
                self._end_line(out)
                start = 1
            else:
                self._overwrite(out)
        while start < size:
            found = _SEPARATOR.search(data, start)
            if found is None:
                self._add(data[start:])
                break
            pos = found.start()
            self._add(data[start:pos])
            if data[pos] == 10:
                self._end_line(out)
            elif pos + 1 == size:
                self._pending_cr = True
            elif data[pos + 1] == 10:
                self._end_line(out)
                pos += 1
            else:
                self._overwrite(out)
            start = pos + 1
        return out

    def close(self) -> list[str]:
        """The end of the stream: what is left is the last line."""
        out: list[str] = []
        if self._pending_cr or self._buf or self._cut or self._unsent:
            self._pending_cr = False
            self._end_line(out)
        return out

    def _add(self, piece: bytes) -> None:
        if b"\b" in piece:
            piece = piece.replace(b"\b", b"")
        room = self._max - len(self._buf)
        if len(piece) > room:
            self._buf += piece[:room]
            self._cut += len(piece) - room
        else:
            self._buf += piece

    def _text(self) -> str:
        if not self._cut:
            return self._buf.decode("utf-8", "replace")
        # "ignore": the cut may split a character
        return self._buf.decode("utf-8", "ignore") + cut_marker(self._cut)

    def _reset(self) -> None:
        self._buf = bytearray()
        self._cut = 0

    def _end_line(self, out: list[str]) -> None:
        text = self._text()
        if self._segmented:
            text = text.rstrip()  # the spaces that blanked a longer segment
            if not text:
                text = self._unsent  # "bar\r\r\n": the bar was the last state
            self._segmented, self._unsent = False, ""
        out.append(text)
        self._last_sent = self._clock()
        self._reset()

    def _overwrite(self, out: list[str]) -> None:
        text = self._text().rstrip()
        self._segmented = True
        self._reset()
        if not text:
            return
        now = self._clock()
        if now - self._last_sent >= self._every:
            out.append(text)
            self._last_sent, self._unsent = now, ""
        else:
            self._unsent = text
