"""The surviving peers' cascade after a task failed, folded in the terminal.

When one worker of a collective job dies, its peers' collectives abort and each
prints its own traceback (~60 lines: "UnavailableError … a peer died or hung")
while the launcher tears the generation down. Those lines are consequences,
not the cause: in the terminal each surviving task's lines after the
generation's failure become one line at its exit, "… N lines after
host1/worker1 failed (its peers' cascade) in <log>"; the log keeps every line,
and the failed task's own lines are shown as they come. `--verbose` shows all.

Pure: no I/O. Must not import the launcher's other modules.
"""

from __future__ import annotations


class CascadeFolder:
    """Per task label: the lines held since the generation's failure, and whose."""

    def __init__(self, enabled: bool = True) -> None:
        self._enabled = enabled
        self._held: dict[str, tuple[int, str]] = {}  # label -> (lines, the failed task)

    def holds(self, label: str, failed: str | None) -> bool:
        """Is this line of `label` part of a cascade (`failed`: the generation's
        failed task, None while none failed)? Held lines are counted, not shown."""
        if not self._enabled or failed is None or label == failed:
            return False
        count, _ = self._held.get(label, (0, failed))
        self._held[label] = (count + 1, failed)
        return True

    def flush(self, label: str, log: str) -> list[str]:
        """The task exited: its fold line, if it held any."""
        count, failed = self._held.pop(label, (0, ""))
        if not count:
            return []
        plural = "s" if count != 1 else ""
        return [f"… {count} line{plural} after {failed} failed (its peers' cascade) in {log}"]
