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
generation started (launcher/job/detect/checkpoints.py), when this machine sees them,
and the last save completed before it (`saved_step`).

Saves: every completed save a task reports (`saved`, `saved_dir`:
runtime/saves.py) is remembered, the chief's before any other's. A task that
resumes behind the last save of an earlier generation (a backup directory
local to each host, a stale copy) is said once per job: `behind`, judged on
each task's own resume point only (its later step reports are no resume
points), and only where both steps are known.

A checkpoint a restore passed over (`passed_over`: it cannot be read,
runtime/readable.py) is said once per checkpoint (`checkpoint_passed_over`);
the generation then resumes behind the last save by design: not said as a
resume behind, and its progress is a save past where it resumed.

The job's step: `runtime.callbacks()` counts a generation's steps from 0 and
says once where it started (`start_step`); every other report names the
optimizer's count or the script's own. `job_step` makes each report's step the
job's (absolute), once, where it enters: every view reads that one number.

Progress: a generation moved the training only when its newest save passed the
best save of the generations before it (`moved_past`); a save made after a
restart from step 0 that does not pass it is no progress. Where a save's step
cannot be read the question is open (None) and the caller keeps its evidence.

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..record import events as ev
from ..record.reports import ProgressReport
from .checkpoints import State

SAVE_DIRS_KEPT = 32  # directories saved to that a task is told (job/policy/savedirs.py)


class Resumes:
    """The generations' resume points, in order, and the last completed save."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self._waiting: int | None = None  # a restarted generation not yet heard from
        self._checkpoint: State | None = None
        self.last_save: dict[str, Any] | None = None  # {step, dir, task}, the job's latest
        self.save_dirs: list[str] = []  # every directory saved to, the newest SAVE_DIRS_KEPT
        self._saved_before: dict[str, Any] | None = None  # as the current generation began
        self._generation = 0
        self._told_behind = False
        self._first: int | None = None  # where generation 0 resumed, when it restored
        self._judged: set[str] = set()  # tasks whose resume point this generation was judged
        self._bases: dict[str, int] = {}  # task: its runtime.callbacks() start, this generation
        self._best_now: int | None = None  # the newest save's step in this generation
        self._unknown: str = ""  # why this generation's steps cannot be compared ("": they can)
        self._passed: set[str] = set()  # the checkpoints passed over (unreadable), told
        self._passed_now = False  # this generation's restore passed one over
        self._resumed_known = True  # where this generation resumed is known (generation 0)

    def starting(self, generation: int, checkpoint: State | None) -> None:
        """Generation `generation` starts; `checkpoint`: the series on disk now."""
        self._waiting = generation if generation > 0 else None
        self._checkpoint = checkpoint
        self._saved_before = self.last_save
        self._generation = generation
        self._judged, self._bases, self._best_now, self._unknown = set(), {}, None, ""
        self._passed_now = False
        self._resumed_known = generation == 0  # where this generation resumed is known

    def with_job_step(self, generation: int, task: str, data: dict[str, Any]
                      ) -> dict[str, Any]:
        """`data` with the job's step (`job_step`) where it has a step."""
        step = self.job_step(generation, task, data)
        return data if step is None else {**data, "job_step": step}

    def job_step(self, generation: int, task: str, data: Mapping[str, Any]) -> int | None:
        """The job's (absolute) step of `task`'s report, or None (no step in it)."""
        report = ProgressReport.read(data)
        step = report.own_step
        if step is None or generation != self._generation:
            return None
        if report.counted:  # the optimizer's count: already the job's
            return step
        if report.start and report.start_step is not None:  # where runtime.callbacks() began
            self._bases[task] = report.start_step - step
        return step + self._bases.get(task, 0)

    def moved_past(self) -> bool | None:
        """Did this generation's newest save pass the best save before it?
        None: it cannot be told (no save with a step, or steps counted anew
        after a restore whose step could not be read)."""
        if self._best_now is None or self._unknown or not self._resumed_known:
            return None
        before = self._saved_before
        if self._passed_now:  # the save before is unreadable: past where it resumed
            here = self.entries[-1] if self.entries else {}
            before = {"step": here.get("step", 0)} if here.get("generation") == \
                self._generation and isinstance(here.get("step"), int) else None
        return before is None or self._best_now > before["step"]

    def on_save(self, task: str, report: ProgressReport | Mapping[str, Any]) -> None:
        """A task reported a completed save (`saved`: its step, `saved_dir`)."""
        report = _read(report)
        step = report.saved
        if step is None:
            return
        if report.saved_dir and not report.saved_dir.startswith("…"):  # not cut short
            if report.saved_dir in self.save_dirs:  # the most recently saved to kept last
                self.save_dirs.remove(report.saved_dir)
            self.save_dirs.append(report.saved_dir)  # the job's: job/policy/savedirs.py
            del self.save_dirs[:-SAVE_DIRS_KEPT]  # a templated path makes one a save
        if self._best_now is None or step > self._best_now:
            self._best_now = step
        # The chief's saves are the ones restored from (the others' may go to
        # scratch folders, or complete where the chief's did not): once the chief
        # reported one, only its saves count.
        last = self.last_save
        if last is None or (report.chief, step) > (last["chief"], last["step"]):
            self.last_save = {"step": step, "dir": report.saved_dir or "", "task": task,
                              "chief": report.chief}

    def told(self, generation: int, task: str, data: Mapping[str, Any]) -> list[ev.Event]:
        """The events a progress report of `task` makes: `resumed` (the
        generation's first resume point), `resume_behind` (once per job)."""
        report = ProgressReport.read(data)
        if report.resume_unknown:  # a restore whose step could not be read
            self._unknown = report.resume_unknown
        last = self.last_save  # the script deleted its backup (fit ended)
        if report.deleted is not None and last and last["dir"] == report.deleted:
            self.last_save = {**last, "deleted": True}
        self.on_save(task, report)
        out: list[ev.Event] = self._passed_over(generation, task, report)
        entry = self.on_progress(generation, report, task)
        if entry is not None:
            out.append(ev.Resumed(**entry))
        behind = self.behind(generation, task, report)
        if behind is not None:
            out.append(ev.ResumeBehind(generation=generation, task=behind["task"],
                                       step=behind["step"], saved_step=behind["saved_step"],
                                       directory=behind["dir"], by=behind["by"]))
        return out

    def _passed_over(self, generation: int, task: str, report: ProgressReport
                     ) -> list[ev.Event]:
        """`checkpoint_passed_over`, once per checkpoint, for a report of one."""
        checkpoint = report.passed_over
        if checkpoint is None:
            return []
        if generation == self._generation:  # the save before it is no restore point:
            self._passed_now, self.last_save = True, None  # the next save is the best
        if checkpoint in self._passed:
            return []
        self._passed.add(checkpoint)
        return [ev.CheckpointPassedOver(
            generation=generation, task=task, checkpoint=checkpoint,
            why=report.passed_over_why or "", kept_in=report.passed_over_to or "",
            restored=report.passed_over_for or "")]

    def on_progress(self, generation: int, report: ProgressReport | Mapping[str, Any],
                    task: str = "") -> dict[str, Any] | None:
        """The resume entry, for the first resume report of a restarted generation
        (`task`: whose report it is, named in the memory tier's `copy`)."""
        report = _read(report)
        if generation == 0 and self._first is None and report.resumed is not None:
            self._first = report.resumed  # a new launch that restored an earlier run's
        if generation != self._waiting:
            return None
        step = report.resume_point
        if step is None and not report.start and report.resume_unknown is None:
            return None
        self._waiting = None
        entry: dict[str, Any] = {"generation": generation}
        if report.resume_unknown is not None:  # restored, at a step that cannot be read
            entry["unknown"] = report.resume_unknown
        epoch = report.resumed_epoch if report.resumed is not None else (
            report.epoch if report.start else None)
        if epoch is not None:
            entry["epoch"] = int(epoch)
        if step is not None:
            entry["step"] = step
        # Steps counted anew (an epoch past the first restored at optimizer step 0:
        # weights without their optimizer) cannot be compared with the saves before.
        self._resumed_known = step is not None and report.resume_unknown is None \
            and not (step == 0 and (epoch or 0) > 0)
        if self._checkpoint:
            entry["checkpoint"] = {path: list(position)
                                   for path, position in sorted(self._checkpoint.items())}
        if report.resumed_from is not None:  # the memory tier's (runtime/memtier.py)
            entry["copy"] = {"from": report.resumed_from, "host": report.resumed_host or "",
                             "path": report.resumed_copy or "", "task": task}
        if self._saved_before is not None:
            entry["saved_step"] = self._saved_before["step"]
        previous = self.entries[-1].get("step") if self.entries else (self._first or 0)
        if isinstance(previous, int) and step is not None and step > previous:
            entry["past"] = previous  # the restart before it moved the training: progress
        self.entries.append(entry)
        return entry

    def behind(self, generation: int, task: str, report: ProgressReport | Mapping[str, Any]
               ) -> dict[str, Any] | None:
        """{task, step, saved_step, dir, by}, once per job, when `task` resumed
        behind the last save completed before this generation."""
        report = _read(report)
        saved = self._saved_before
        if self._told_behind or generation != self._generation or generation == 0 \
                or saved is None or saved.get("deleted") or task in self._judged:
            return None
        if report.resume_unknown is not None or self._passed_now:  # a step unknown, or
            self._judged.add(task)  # saves passed over as unreadable: behind them by design
            return None
        step = report.resume_point
        if step is None:
            return None
        self._judged.add(task)  # its later reports are steps trained, not resume points
        if step >= saved["step"]:
            return None
        self._told_behind = True
        return {"task": task, "step": step, "saved_step": saved["step"], "dir": saved["dir"],
                "by": saved["task"]}


def _read(report: ProgressReport | Mapping[str, Any]) -> ProgressReport:
    return report if isinstance(report, ProgressReport) else ProgressReport.read(report)
