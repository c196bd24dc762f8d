"""Where each restarted generation resumed training, and the saves before it.

After a restart the workers restore the last checkpoint; the user wants to
know which. The evidence, from any script (docs/fault-tolerance.md, "What
counts as progress and as a resume"):

- `resumed` (with `resumed_epoch`, `resumed_dir`): the bootstrap read the
  step where the task's restore left its optimizer (runtime/restores.py:
  Keras `fit`'s first epoch, a `tf.train.Checkpoint` or `CheckpointManager`
  restore), with no runtime call in the script;
- `start_epoch` (with `start_step`): `runtime.callbacks()`' first epoch;
- a custom loop's own first `runtime.report_progress(step)`.

(The steps read off the optimizer seconds into training, marked `counted`,
are never a resume point.) The first such report of a generation after a
restart is where it resumed: a `resumed` event (worded "generation 2 resumed
at epoch 3 (step 30)" by launcher/views/narrate.py) and an entry of the
summary's `resumed` list, with the checkpoint series seen on disk when the
generation started (launcher/job/checkpoints.py), when this machine sees them,
and the last save completed before it (`saved_step`).

Saves: every completed save a task reports (`saved`, `saved_dir`:
runtime/saves.py) is remembered, the chief's before any other's. A task that
resumes behind the last save of an earlier generation (a backup directory
local to each host, a stale copy) is said once per job: `behind`.

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from typing import Any

from . import events as ev
from .checkpoints import State


class Resumes:
    """The generations' resume points, in order, and the last completed save."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._waiting: int | None = None  # a restarted generation not yet heard from
        self._checkpoint: State | None = None
        self.last_save: dict[str, Any] | None = None  # {step, dir, task}, the job's latest
        self._saved_before: dict[str, Any] | None = None  # as the current generation began
        self._generation = 0
        self._told_behind = False
        self._first: int | None = None  # where generation 0 resumed, when it restored

    def starting(self, generation: int, checkpoint: State | None) -> None:
        """Generation `generation` starts; `checkpoint`: the series on disk now."""
        self._waiting = generation if generation > 0 else None
        self._checkpoint = checkpoint
        self._saved_before = self.last_save
        self._generation = generation

    def on_save(self, task: str, data: dict[str, Any]) -> None:
        """A task reported a completed save (`saved`: its step, `saved_dir`)."""
        step = data.get("saved")
        if not isinstance(step, int | float) or isinstance(step, bool):
            return
        # The chief's saves are the ones restored from (the others' may go to
        # scratch folders, or complete where the chief's did not): once the chief
        # reported one, only its saves count.
        last = self.last_save
        key = (bool(data.get("chief")), int(step))
        if last is None or key > (last["chief"], last["step"]):
            self.last_save = {"step": int(step), "dir": str(data.get("saved_dir") or ""),
                              "task": task, "chief": bool(data.get("chief"))}

    def told(self, generation: int, task: str, data: dict[str, Any]) -> list[ev.Event]:
        """The events a progress report of `task` makes: `resumed` (the
        generation's first resume point), `resume_behind` (once per job)."""
        self.on_save(task, data)
        out: list[ev.Event] = []
        entry = self.on_progress(generation, data, task)
        if entry is not None:
            out.append(ev.Resumed(**entry))
        behind = self.behind(generation, task, data)
        if behind is not None:
            out.append(ev.ResumeBehind(generation=generation, task=behind["task"],
                                       step=behind["step"], saved_step=behind["saved_step"],
                                       directory=behind["dir"], by=behind["by"]))
        return out

    def on_progress(self, generation: int, data: dict[str, Any], task: str = ""
                    ) -> dict[str, Any] | None:
        """The resume entry, for the first resume report of a restarted generation
        (`task`: whose report it is, named in the memory tier's `copy`)."""
        if generation == 0 and self._first is None and isinstance(data.get("resumed"), int):
            self._first = data["resumed"]  # a new launch that restored an earlier run's
        if generation != self._waiting:
            return None
        step = _resume_step(data)
        if step is None and not data.get("start_epoch"):
            return None
        self._waiting = None
        entry: dict[str, Any] = {"generation": generation}
        epoch = data.get("resumed_epoch") if "resumed" in data else (
            data.get("epoch") if data.get("start_epoch") else None)
        if isinstance(epoch, int | float):
            entry["epoch"] = int(epoch)
        if step is not None:
            entry["step"] = step
        if self._checkpoint:
            entry["checkpoint"] = {path: list(position)
                                   for path, position in sorted(self._checkpoint.items())}
        if isinstance(data.get("resumed_from"), str):  # the memory tier's (runtime/memtier.py)
            entry["copy"] = {"from": data["resumed_from"],
                             "host": str(data.get("resumed_host") or ""),
                             "path": str(data.get("resumed_copy") or ""), "task": task}
        if self._saved_before is not None:
            entry["saved_step"] = self._saved_before["step"]
        previous = self.entries[-1].get("step") if self.entries else (self._first or 0)
        if isinstance(previous, int) and step is not None and step > previous:
            entry["past"] = previous  # the restart before it moved the training: progress
        self.entries.append(entry)
        return entry

    def behind(self, generation: int, task: str, data: dict[str, Any]) -> dict[str, Any] | None:
        """{task, step, saved_step, dir, by}, once per job, when `task` resumed
        behind the last save completed before this generation."""
        saved = self._saved_before
        if self._told_behind or generation != self._generation or generation == 0 \
                or saved is None:
            return None
        step = _resume_step(data)
        if step is None or step >= saved["step"]:
            return None
        self._told_behind = True
        return {"task": task, "step": step, "saved_step": saved["step"], "dir": saved["dir"],
                "by": saved["task"]}


def _resume_step(data: dict[str, Any]) -> int | None:
    """The step a progress report names as a resume point (None: not one)."""
    for key in ("resumed", "start_step"):
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and (key == "resumed" or data.get("start_epoch")):
            return int(value)
    if data.get("counted") or data.get("start_epoch") or "saved" in data:
        return None  # the optimizer's count seconds into training; a fit with no step read
    step = data.get("step")
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None
