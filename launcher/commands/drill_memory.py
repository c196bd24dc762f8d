"""The memory tier's cost as the drill measures it (`checkpoint.memory`, `drill --memory`).

With the memory tier on, a save blocks training for its write into host
memory (the saves the bootstrap times: the drill's `save_s`), and the host's
agent then writes the same bytes to the script's directory in the
background, aside then renamed: what a save to the directory would have
blocked. The agent tells each copy's seconds and bytes as the saving task's
progress (`memory_copy_s`, `memory_copy_bytes`: launcher/agent/memcopy.py);
this view of the job keeps them. launcher/views/drill_report.py turns both
into the advice (`memory_advice`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from ..job.record import events as ev


class MemoryCosts:
    """A view of the drill's job: the background copies' seconds and bytes."""

    def __init__(self) -> None:
        self.copy_s: list[float] = []
        self.copy_bytes: list[int] = []

    def open(self, record: Callable[[ev.Event], None]) -> None:
        """Adds no events of its own."""

    def close(self) -> None:
        pass

    def tell(self, event: ev.Event) -> None:
        if not isinstance(event, ev.Progress):
            return
        seconds, size = event.metrics.get("memory_copy_s"), event.metrics.get("memory_copy_bytes")
        if _number(seconds):
            self.copy_s.append(float(seconds))
            if _number(size):
                self.copy_bytes.append(int(size))

    def figures(self) -> dict[str, float] | None:
        """The median copy (seconds, MB), None when no copy was told (the tier off)."""
        if not self.copy_s:
            return None
        out = {"directory_s": round(statistics.median(self.copy_s), 3),
               "copies": float(len(self.copy_s))}
        if self.copy_bytes:
            out["copy_mb"] = round(statistics.median(self.copy_bytes) / 1e6, 1)
        return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0
