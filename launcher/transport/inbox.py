"""The supervisor's inbox: every agent link's reader puts its messages here,
the supervisor thread alone takes them (`put`/`get` as `queue.Queue`).

Task output is bounded, control is not, and control goes first in a flood.
A task may print far faster than the launcher can write its lines to the
terminal and the log (two tasks printing 100 MB in a second): an unbounded
queue grew to gigabytes, and a task's exit, queued behind the backlog, was
seen tens of seconds late (a Ctrl-C then found tasks that had long exited 0
still "running"). Here:
- every message but `output` (an exit, a start, a heartbeat, a lost agent)
  is always kept, in order;
- while at most PRIORITY_AFTER output lines wait, everything comes out in
  the order it came; beyond that, control messages come out first (an exit
  is seen at once; the supervisor handles what is left of the output before
  a generation ends, so the logs still end with a task's last lines);
- output lines wait only while fewer than OUTPUT_LINES lines and OUTPUT_BYTES
  of text wait; past that a new line is dropped and counted (per task).
Lines cut by an agent (8 KiB) are counted too; `drop_report()` says both once,
at the end.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any

# What may wait of task output: memory (a line costs ~1 KB queued, 8 KiB of
# text at most), and a backlog a busy host still clears in seconds (a line
# costs the supervisor tens of µs: check, terminal buffer, log write, watch).
OUTPUT_LINES = 20_000
OUTPUT_BYTES = 16 * 2**20
# Beyond this many output lines waiting, control messages jump the queue.
PRIORITY_AFTER = 500
CUT_MARK = "[mgpu-launch: line cut, "  # the agent's marker (launcher.outlines)


class Inbox:
    def __init__(self, output_lines: int = OUTPUT_LINES,
                 output_bytes: int = OUTPUT_BYTES) -> None:
        self._max_lines = output_lines
        self._max_bytes = output_bytes
        self._control: collections.deque[tuple[int, Any]] = collections.deque()
        self._output: collections.deque[tuple[int, Any, int, str]] = collections.deque()
        self._closed = False
        self._seq = 0  # arrival order
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
            self._seq += 1
            if self._closed:
                return
            if size is None:
                self._control.append((self._seq, item))
            elif self._lines >= self._max_lines or self._bytes + size > self._max_bytes:
                self.dropped[key] += 1
                return
            else:
                self._lines += 1
                self._bytes += size
                self._output.append((self._seq, item, size, key))
            self._cond.notify()

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self._cond:
            if not self._cond.wait_for(lambda: self._control or self._output,
                                       timeout if block else 0):
                raise queue.Empty
            if self._control and (not self._output or self._lines > PRIORITY_AFTER
                                  or self._control[0][0] < self._output[0][0]):
                return self._control.popleft()[1]
            _, item, size, _ = self._output.popleft()
            self._lines -= 1
            self._bytes -= size
            return item

    def get_nowait(self) -> Any:
        return self.get(block=False)

    def qsize(self) -> int:
        with self._cond:
            return len(self._control) + len(self._output)

    def empty(self) -> bool:
        return self.qsize() == 0

    def close(self) -> None:
        """The run is over: output still waiting counts as dropped (the logs
        lack it); whatever comes later is ignored."""
        with self._cond:
            self._closed = True
            for _, _, _, key in self._output:
                self.dropped[key] += 1
            self._output.clear()
            self._lines = self._bytes = 0

    def drop_report(self) -> str:
        """One sentence on the lines dropped and cut, or "" when none were."""
        parts = []
        if self.dropped:
            total = sum(self.dropped.values())
            each = ", ".join(f"{k}: {n}" for k, n in sorted(self.dropped.items()))
            parts.append(f"task output lines dropped: {total} ({each}); they came faster "
                         "than the launcher could write them")
        if self.cut:
            total = sum(self.cut.values())
            each = ", ".join(f"{k}: {n}" for k, n in sorted(self.cut.items()))
            parts.append(f"lines cut at 8 KiB: {total} ({each})")
        return "; ".join(parts)
