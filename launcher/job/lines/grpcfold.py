"""gRPC errors about a ParameterServerStrategy worker that is restarting alone,
folded in the terminal to one line per task that printed them and restart.

When a worker dies, the coordinator (the chief) keeps trying to reach it until
it serves again: each try prints a block of four lines (`Failed to register
function remotely ... Connection refused`, `Additional GRPC error information
from remote target /job:worker/replica:0/task:1 ...`, `:UNKNOWN:Error received
from peer ...`, `This could happen if the remote target has been disconnected
from the client.`), hundreds of them while the worker restarts cold. The
launcher has said the failure and the restart already. From the restart until
the worker prints that it serves again, a line that names that worker (its
`/job:worker/replica:0/task:N`, its address and port, or its port in a
connection error) is held back, with the block's last sentence; when the
worker serves again, or the task that printed them exits, the terminal says
"… N lines of gRPC errors while h1/worker1 restarted alone, in <log>". The log
keeps every line. A line about any other task, or one printed before the
restart was seen or after the worker serves, is shown.

Pure: no I/O. Must not import the launcher's other modules.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

# The last line of each block (it names no task): held when the line before was.
_TAIL = "This could happen if the remote target has been disconnected from the client."
# A connection error that names a port only (gRPC may print an address resolved
# otherwise than the cluster names it).
_REFUSED = ("Connection refused", "failed to connect", "Failed to connect")


@dataclass(frozen=True)
class Restarting:
    """A worker restarted alone: its label, and what names it in TensorFlow's errors."""

    label: str  # h1/worker1
    index: int  # its index among the workers
    address: str  # as TF_CONFIG names it
    port: int | None

    def named_in(self, text: str) -> bool:
        if re.search(rf"/job:worker/replica:0/task:{self.index}(?!\d)", text):
            return True
        if self.port is None:
            return False
        if re.search(rf"{re.escape(self.address)}:{self.port}(?!\d)", text):
            return True
        return any(words in text for words in _REFUSED) \
            and re.search(rf":{self.port}(?!\d)", text) is not None


class GrpcFolder:
    """Per task label that prints: which lines the terminal shows (`show`), and
    the fold lines owed when a worker serves again (`back`) or the task exits
    (`flush`). `enabled=False` (--verbose) shows all."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._restarting: dict[str, Restarting] = {}  # worker name -> what names it
        self._held: dict[tuple[str, str], int] = {}  # (label, worker name) -> lines held
        self._last: dict[str, str] = {}  # label -> the worker its last line was held for

    def restarting(self, name: str, worker: Restarting) -> None:
        """`name` (worker1) was restarted alone: its errors are held until it serves."""
        self._restarting[name] = worker

    def waits_for(self, name: str) -> bool:
        """Is worker `name` restarting (its errors held until it serves)?"""
        return name in self._restarting

    def show(self, label: str, text: str) -> list[str]:
        """[text], or [] when it is held back (the log keeps it)."""
        if not self._enabled or not self._restarting:
            return [text]
        last = self._last.pop(label, None)
        if text.strip() == _TAIL and last is not None:
            self._hold(label, last)
            return []
        for name, worker in self._restarting.items():
            if worker.label != label and worker.named_in(text):
                self._hold(label, name)
                self._last[label] = name
                return []
        return [text]

    def back(self, name: str, text: str,
             log_of: Callable[[str], str]) -> list[tuple[str, str]]:
        """A line of worker `name`: when it says it serves again, its restart is
        over; the (label, fold line) owed to each task that printed its errors."""
        if name not in self._restarting or not text.startswith(f"mgpu-launch: {name} serving"):
            return []
        worker = self._restarting.pop(name)
        owed = [(label, n) for (label, n) in self._held if n == name]
        return [(label, self._fold_line(label, name, worker, log_of(label)))
                for label, _ in owed]

    def flush(self, label: str, log: str) -> list[str]:
        """The task `label` exited: its fold lines still owed."""
        self._last.pop(label, None)
        return [self._fold_line(label, name, self._restarting.get(name), log)
                for (held_by, name) in list(self._held) if held_by == label]

    def _hold(self, label: str, name: str) -> None:
        self._held[(label, name)] = self._held.get((label, name), 0) + 1

    def _fold_line(self, label: str, name: str, worker: Restarting | None, log: str) -> str:
        held = self._held.pop((label, name), 0)
        who = worker.label if worker is not None else name
        plural = "s" if held != 1 else ""
        return (f"… {held} line{plural} of gRPC errors while {who} restarted alone "
                f"(it could not be reached), in {log}")
