"""The training's own events: where a restarted generation resumed, a resume
behind the last save, the memory tier's copies, a loss or a save gone
non-finite, a loss spike and a bad batch skipped (the NaN sentinel:
launcher/job/detect/sentinel.py).
Every kind is listed in launcher/job/record/events.py's `KINDS`, which reads and
writes their lines.

Pure values. Must not import views, commands or cli.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .eventbase import Event, TaskEvent


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
    """The memory tier: a save copied into another host's memory (job/run/peerrelay.py)."""

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


@dataclass(frozen=True, kw_only=True)
class Nonfinite(TaskEvent):
    """A task's training loss went non-finite (inf or NaN) at a step, as its
    bootstrap saw it (runtime/sentinel.py); the first of each generation (the
    task heard first: Keras' logged loss is reduced across the workers).
    `epoch` and `batch` as Keras' callbacks number them, from 0."""

    kind = "nonfinite"
    optional = ("step",)
    step: int | None = None  # the optimizer's step that went bad (None: not read)
    epoch: int = 0
    batch: int = 0
    loss: str = ""  # the epoch's running mean then: "inf" or "nan"


@dataclass(frozen=True, kw_only=True)
class NonfiniteSave(TaskEvent):
    """A save of non-finite weights: not a save (no progress, no resume point);
    the first of each generation."""

    kind = "nonfinite_save"
    optional = ("step", "after_spike")
    step: int | None = None
    directory: str = ""
    # Finite, but trained past a loss spike that `on_spike: rollback` rolls back.
    after_spike: bool | None = None


@dataclass(frozen=True, kw_only=True)
class BatchSkipped(Event):
    """A bad batch skipped: its loss went non-finite (or spiked, with `on_spike:
    rollback`) at the same step `step` again after the restart from the save
    before it, at the position (epoch, batch) of its epoch, from 0. Generation
    `generation` and every later one read it and drop it (not trained);
    `skips` of `sentinel.max_skips` so far."""

    kind = "batch_skipped"
    generation: int  # the first generation that skips it
    step: int = 0
    epoch: int = 0
    batch: int = 0
    skips: int = 0
    max_skips: int = 0


@dataclass(frozen=True, kw_only=True)
class BatchSkipDone(TaskEvent):
    """A skip (`batch_skipped`) as the task did it, the first task to say so
    per generation and position: batch `batch` of epoch `epoch` (from 0) read
    and dropped at step `step` (`done`), or trained in its place (`done`
    false: another `fit` of the script at that position, at step `step`)."""

    kind = "batch_skip_done"
    optional = ("step",)
    epoch: int = 0
    batch: int = 0
    step: int | None = None
    done: bool = True


@dataclass(frozen=True, kw_only=True)
class ReplayPassed(Event):
    """Generation `generation`, restarted from the save before the step whose
    loss went bad in the generation before, trained past that step with its
    batch not skipped: a one-off fault. `exact`: the replay read the same input
    at that step (a carried input), so the batch is cleared too; `first`: the
    task (host/task) that reported the bad loss first."""

    kind = "replay_passed"
    generation: int
    step: int = 0
    first: str = ""
    exact: bool = False


@dataclass(frozen=True, kw_only=True)
class LossSpike(TaskEvent):
    """A task's step loss far above its recent window (runtime/spikes.py): a
    robust z-score of `z` over the window's `median`. `rollback`: the cluster
    file's `sentinel: {on_spike: rollback}` stops the generation as a
    non-finite loss does; else only said."""

    kind = "loss_spike"
    step: int = 0
    epoch: int = 0
    batch: int = 0
    loss: float = 0.0  # the step's own loss
    median: float = 0.0
    z: float = 0.0
    rollback: bool = False
