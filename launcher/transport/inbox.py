"""The supervisor's inbox: every agent link's reader puts its messages here,
the supervisor thread alone takes them (`put`/`get` as `queue.Queue`).

Task output is bounded, control is not. A task may print far faster than the
launcher can write its lines to the terminal and the log (two tasks printing
100 MB in a second): an unbounded queue grew to gigabytes, and a task's exit,
queued behind the backlog, was seen tens of seconds late (a Ctrl-C then
found tasks that had long exited 0 still "running"). Here `output` lines wait
only while fewer than OUTPUT_LINES lines and OUTPUT_BYTES of text wait; past
that a new line is dropped and counted (per task). Every other message (an
exit, a start, a heartbeat, a lost agent) is always kept, in order, so it is
at most that bounded backlog behind: a fraction of a second of the
supervisor's work. Lines cut by an agent (8 KiB) are counted too;
`drop_report()` says both once, at the end.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any

# What may wait of task output. A line costs the supervisor tens of µs
# (check, terminal buffer, log write, output watch): 2,000 lines are well
# under a second behind, even on a busy host; the bytes bound memory (8 KiB
# lines).
OUTPUT_LINES = 2000
OUTPUT_BYTES = 4 * 2**20
CUT_MARK = "[mgpu-launch: line cut, "  # the agent's marker (launcher.outlines)


class Inbox:
    def __init__(self, output_lines: int = OUTPUT_LINES,
                 output_bytes: int = OUTPUT_BYTES) -> None:
        self._max_lines = output_lines
        self._max_bytes = output_bytes
        self._items: collections.deque[tuple[Any, int | None]] = collections.deque()
        self._cond = threading.Condition()
        self._lines = 0
        self._bytes = 0
        self.dropped: collections.Counter[str] = collections.Counter()  # "host/task" -> lines
        self.cut: collections.Counter[str] = collections.Counter()

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Queue an AgentMessage; a task output line beyond the bound is dropped.
        Never blocks (`block`, `timeout`: queue.Queue's signature)."""
        message = getattr(item, "message", None)
        size: int | None = None
        if isinstance(message, dict) and message.get("ev") == "output":
            text = message.get("text")
            size = len(text) if isinstance(text, str) else 0
            key = f"{getattr(item, 'host', '?')}/{message.get('task')}"
            if isinstance(text, str) and CUT_MARK in text[-80:]:
                self.cut[key] += 1
        with self._cond:
            if size is not None:
                if self._lines >= self._max_lines or self._bytes + size > self._max_bytes:
                    self.dropped[key] += 1
                    return
                self._lines += 1
                self._bytes += size
            self._items.append((item, size))
            self._cond.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: self._items, timeout if block else 0):
                raise queue.Empty
            item, size = self._items.popleft()
            if size is not None:
                self._lines -= 1
                self._bytes -= size
            return item

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def empty(self) -> bool:
        return self.qsize() == 0

    def drop_report(self) -> str:
        """One sentence on the lines dropped and cut, or "" when none were."""
        parts = []
        if self.dropped:
            total = sum(self.dropped.values())
            each = ", ".join(f"{k}: {n}" for k, n in sorted(self.dropped.items()))
            parts.append(f"{total} lines of task output were dropped ({each}): they came "
                         "faster than the launcher could write them")
        if self.cut:
            total = sum(self.cut.values())
            each = ", ".join(f"{k}: {n}" for k, n in sorted(self.cut.items()))
            parts.append(f"{total} lines were longer than 8 KiB and cut ({each})")
        return "; ".join(parts)
