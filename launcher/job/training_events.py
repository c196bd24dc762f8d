"""The training's own events: where a restarted generation resumed, a resume
behind the last save, the memory tier's copies. Every kind is listed
in launcher/job/events.py's `KINDS`, which reads and writes their lines.

Pure values. Must not import views, commands or cli.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .eventbase import Event


@dataclass(frozen=True, kw_only=True)
class Resumed(Event):
    kind = "resumed"
    optional = ("epoch", "step", "checkpoint", "saved_step", "past", "copy", "unknown")
    generation: int
    epoch: int | None = None
    step: int | None = None
    checkpoint: dict[str, Any] | None = None
    saved_step: int | None = None  # the last save completed before this generation
    past: int | None = None  # the previous resume point, when this one moved past it
    # With the memory tier: the copy restored, {from: memory|peer|shared, host, path, task}
    # (the first task to report; each task's own is in its progress lines).
    copy: dict[str, Any] | None = None
    unknown: str | None = None  # why the step it resumed at cannot be read (no step)


@dataclass(frozen=True, kw_only=True)
class MemoryCopy(Event):
    """The memory tier: a save copied into another host's memory (job/peerrelay.py)."""

    kind = "memory_copy"
    optional = ("error", "covered_by")
    host: str  # where the copy is now
    source: str = ""  # the host it came from
    origin: str = ""  # the host that saved it
    checkpoint: str = ""
    bytes: int = 0
    seconds: float = 0.0
    placed: bool = False  # placed back for a restart (else: the save's second copy)
    error: str | None = None  # why it failed
    # not sent: the task on `host` whose own save is this one byte for byte (a worker's)
    covered_by: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResumeBehind(Event):
    """A task resumed behind the last completed save (told once per job)."""

    kind = "resume_behind"
    generation: int
    task: str
    step: int = 0
    saved_step: int = 0
    directory: str = ""
    by: str = ""  # the task that saved it
