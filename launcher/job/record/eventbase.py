"""What every event has: the base records of the story (launcher/job/record/events.py
holds every kind and its JSON line; job/record/training_events.py the training's own).

Pure values. Must not import views, commands or cli.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, kw_only=True)
class Event:
    """What every event has: when (Unix time, set when written or read back)."""

    kind: ClassVar[str] = ""
    recorded: ClassVar[bool] = True  # written to events.jsonl
    # Fields left out of the line when None (they were absent before, too).
    optional: ClassVar[tuple[str, ...]] = ()
    t: float | None = field(default=None, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # keys not known here


@dataclass(frozen=True, kw_only=True)
class TaskEvent(Event):
    """An event of one task of one generation."""

    generation: int
    task: str  # the task's name: worker1
    host: str

    @property
    def label(self) -> str:
        return f"{self.host}/{self.task}"
