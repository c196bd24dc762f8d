"""The training's history as the story tells it: each generation's progress in
absolute steps, its first step, where it resumed, the saves reported (and how
long each took), each task's exit. A part of the run's model
(`job/record/story.py`'s `Story.history`), told every event once the story has
stamped its time; the drill's verdicts read it (launcher/commands/drill_faults.py).

Steps are absolute: `runtime.callbacks()` counts a generation's steps from 0
and reports the restored step count (`start_step`) once, at its first epoch;
that offset is added to the generation's later reports. A script that reports
no steps still has its optimizer's count read every 2 s (`counted`,
runtime/steps.py): the count moving past the restored one is its first step.

Each report itself (`points`, the series the drill reads a save's cost and
the steps/s from) is kept only by a history asked to (`History(keep_reports=True)`:
the drill's), up to `POINTS_KEPT` per task and generation: the live views'
story lives as long as the launch and is told every report of every task.
Pure: no I/O, no clock. Must not import supervisor, transport, views,
commands or cli.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from . import events as ev
from .reports import ProgressReport

Point = tuple[float, int, bool]  # (t, absolute step, a checkpoint was saved by then)
POINTS_KEPT = 4096
SAVERS = ("chief", "worker0")  # the task that saves, as the runtime picks it


@dataclass(frozen=True)
class Save:
    """A completed save reported (by the saver, else by a peer)."""

    t: float
    step: int
    generation: int
    by_saver: bool


@dataclass(frozen=True)
class Exit:
    t: float
    exit_code: int | None
    signal: int | None
    finished: bool  # it exited 0 by itself: its training ended


@dataclass
class History:
    """Told every event (`tell`), with its time set."""

    keep_reports: bool = False  # keep each report (`points`)
    points: dict[tuple[int, str], deque[Point]] = field(default_factory=dict)
    latest_t: dict[tuple[int, str], float] = field(default_factory=dict)  # a task's last report
    offset: dict[int, int] = field(default_factory=dict)  # generation: restored step count
    resumed: dict[int, int] = field(default_factory=dict)  # generation: step it resumed at
    first_step_t: dict[int, float] = field(default_factory=dict)  # the script's word
    counted_first: dict[int, tuple[float, int]] = field(default_factory=dict)
    counted_moved: dict[int, float] = field(default_factory=dict)  # the optimizer's count
    furthest_step: dict[int, int] = field(default_factory=dict)
    # generation: why its resume point cannot be read (runtime/restores.py)
    unknown: dict[int, str] = field(default_factory=dict)
    fit_ended: set[int] = field(default_factory=set)  # generations whose fit ended
    exits: dict[tuple[int, str], Exit] = field(default_factory=dict)
    saves: list[Save] = field(default_factory=list)
    saves_reported: bool = False  # any task reported a save
    saver_reports: bool = False  # the saver did: a peer's word no longer counts
    save_seconds: list[float] = field(default_factory=list)  # each save's time, as timed

    def tell(self, event: ev.Event) -> None:
        t = event.t or 0.0
        if isinstance(event, ev.Progress):
            self._progress(event, t)
        elif isinstance(event, ev.TaskExited):
            self.exits[(event.generation, event.task)] = Exit(
                t, event.exit_code, event.signal,
                finished=event.exit_code == 0 and not event.stopped_by_launcher)

    def _progress(self, event: ev.Progress, t: float) -> None:
        r, gen = ProgressReport.read(event.metrics), event.generation
        if r.save_s is not None:
            self.save_seconds.append(r.save_s)
        if r.saved is not None:
            # A completed save the bootstrap saw, wherever the script keeps it
            # (runtime/saves.py): its step is the optimizer's count.
            self._save(event.task, r.saved, gen, t, r.chief)
        if r.resumed is not None and gen > 0:  # read at the restore
            self.resumed.setdefault(gen, r.resumed)
        if r.resume_unknown is not None and gen > 0:
            self.unknown.setdefault(gen, r.resume_unknown)
        if r.deleted is not None:  # fit ended (its backup deleted): the training is over
            self.fit_ended.add(gen)
        step = r.own_step
        if step is None:
            return
        if r.start:  # runtime.callbacks() after a restore, before a step
            self.offset[gen] = r.start_step or 0
            self.resumed.setdefault(gen, self.offset[gen])
            return
        if r.counted:
            first = self.counted_first.setdefault(gen, (t, self.resumed.get(gen, step)))
            if step > first[1]:
                self.counted_moved.setdefault(gen, t)
            self._point(gen, event.task, (t, step, r.saved is not None))
            return
        absolute = step + self.offset.get(gen, 0)
        if gen > 0 and gen not in self.resumed:  # the first step done after the restore
            self.resumed[gen] = max(0, absolute - 1)
        self.first_step_t.setdefault(gen, t)
        if r.checkpoint and r.saved is None:  # the script's own word (runtime.callbacks())
            self._save(event.task, absolute, gen, t, False)
        self._point(gen, event.task, (t, absolute, r.checkpoint))

    def _point(self, gen: int, task: str, point: Point) -> None:
        latest = self.latest_t.get((gen, task))
        if latest is None or point[0] > latest:
            self.latest_t[(gen, task)] = point[0]
        if self.keep_reports:
            points = self.points.get((gen, task))
            if points is None:
                points = self.points[(gen, task)] = deque(maxlen=POINTS_KEPT)
            points.append(point)
        furthest = self.furthest_step.get(gen)
        if furthest is None or point[1] > furthest:
            self.furthest_step[gen] = point[1]

    def _save(self, task: str, step: int, gen: int, t: float, chief: bool) -> None:
        """A save reported: the saver's word first (a peer may run ahead of its save)."""
        self.saves_reported = True
        saver = chief or task in SAVERS
        if not saver and self.saver_reports:
            return
        if saver and not self.saver_reports:
            self.saver_reports = True
            self.saves = [s for s in self.saves if s.by_saver]
        if (step, gen) not in {(s.step, s.generation) for s in self.saves[-4:]}:
            self.saves.append(Save(t, step, gen, self.saver_reports))

    # ------------------------------------------------------------- reading

    def first_step(self, gen: int) -> float | None:
        """When generation `gen` trained its first step (the script's word first)."""
        return self.first_step_t.get(gen) or self.counted_moved.get(gen)

    def resumed_at(self, gen: int) -> int | None:
        """The step generation `gen` resumed at (None: not told yet)."""
        if gen in self.resumed:
            return self.resumed[gen]
        return self.counted_first[gen][1] if gen in self.counted_first else None

    def furthest(self, gen: int) -> int | None:
        """The furthest step any task of `gen` reported."""
        return self.furthest_step.get(gen)

    def finished_in(self, gen: int, but: str) -> bool:
        """Did a task of `gen` other than `but` end its training by itself (or its
        `fit` end, deleting its backup)?"""
        return gen in self.fit_ended or any(
            g == gen and task != but and e.finished for (g, task), e in self.exits.items())

    def trained_since(self, gen: int, task: str, t: float) -> bool:
        """Did `task` of `gen` report a step after `t`?"""
        latest = self.latest_t.get((gen, task))
        return latest is not None and latest > t

    def series(self, until: dict[int, float]) -> list[list[Point]]:
        """One task's reports per generation, up to `until[generation]` (its
        fault): one whose reports say a save (the saver's), else the one with
        most (none unless kept: `keep_reports`)."""
        best: dict[int, list[Point]] = {}

        def rank(points: list[Point]) -> tuple[bool, int]:
            return any(p[2] for p in points), len(points)

        for (gen, _), pts in self.points.items():
            kept = [p for p in pts if p[0] < until.get(gen, float("inf"))]
            if rank(kept) > rank(best.get(gen, [])):
                best[gen] = kept
        return [best[g] for g in sorted(best)]
