"""Where each restarted generation resumed training, from its first progress report.

After a restart the workers restore the last checkpoint; the user wants to
know which. The runtime's Keras callbacks report the first epoch they see begin
(after the backup's restore) as `start_epoch`, with the optimizer's restored
step count (`start_step`); a custom loop that calls `runtime.report_progress`
reports its own step, restored from its checkpoint. (The steps the bootstrap
reads off the optimizer of a script that reports nothing, marked `counted`,
are taken a few seconds into training: never a resume point.) The first such report of a
generation after a restart is where it resumed: a `resumed` event (worded
"generation 2 resumed at epoch 3 (step 30)" by launcher/ops/narrate.py) and an
entry of the summary's `resumed` list, with the checkpoint series seen on disk when the generation
started (launcher/job/checkpoints.py), when this machine sees them.

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from typing import Any

from .checkpoints import State


class Resumes:
    """The generations' resume points, in order."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._waiting: int | None = None  # a restarted generation not yet heard from
        self._checkpoint: State | None = None

    def starting(self, generation: int, checkpoint: State | None) -> None:
        """Generation `generation` starts; `checkpoint`: the series on disk now."""
        self._waiting = generation if generation > 0 else None
        self._checkpoint = checkpoint

    def on_progress(self, generation: int, data: dict[str, Any]) -> dict[str, Any] | None:
        """The resume entry, for the first progress report of a restarted generation."""
        if generation != self._waiting or not isinstance(data.get("step"), int | float):
            return None
        if data.get("counted"):  # the optimizer's count seconds into training (runtime.steps)
            return None
        self._waiting = None
        entry: dict[str, Any] = {"generation": generation}
        if data.get("start_epoch"):
            entry["epoch"] = int(data.get("epoch") or 0)
            if isinstance(data.get("start_step"), int | float):
                entry["step"] = int(data["start_step"])
        else:
            entry["step"] = int(data["step"])
        if self._checkpoint:
            entry["checkpoint"] = {path: list(position)
                                   for path, position in sorted(self._checkpoint.items())}
        self.entries.append(entry)
        return entry

