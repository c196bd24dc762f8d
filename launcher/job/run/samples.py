"""Progress lines of events.jsonl at a bounded rate; the views still get every report.

A task reports its progress as often as its script does: `runtime.callbacks()`
twice a second, the optimizer's step counter every 2 s, a custom loop's
`report_progress` maybe every step. The live table and the supervisor see
every report; `events.jsonl` keeps, per task:

- every report of a generation's first `WHOLE_S` seconds, at most one per
  `FLOOR_S` but every epoch's end and save (the start of a generation is
  where a user looks first: when did it form, where did it resume, how fast
  did it go);
- then at most one line per `EVERY_S`;
- a report held back is not lost: what it carried that counts (`save_s`, the
  seconds spent saving, and `checkpoint`) rides on the next line written; the
  last one held back is written once its gap has passed (`due`, on the
  supervisor's watch tick: a task gone quiet still shows its last step) or
  when its task exits (the last step before a failure: docs/goodput.md), with
  the time it arrived, so a line may come a little after later events;
- a restarted task's resume point (`resumed`, `start_epoch`) is always
  written; the last save held back (`saved`, `saved_dir`) rides on the next line.

docs/operations.md states the rate and the file's growth. Pure bookkeeping;
owned by the supervisor thread. Must not import views, commands or cli.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..record import events as ev
from ..record.reports import ProgressReport

WHOLE_S = 120.0
FLOOR_S = 0.05
EVERY_S = 30.0


@dataclass
class _Held:
    """A task's latest report not written yet, and what those held carried."""

    event: ev.Progress
    t: float
    save_s: float = 0.0
    checkpoint: bool = False
    saved: dict[str, Any] | None = None  # the latest completed save's `saved`, `saved_dir`


class ProgressSampler:
    """Which told events go to events.jsonl, and when (see the module's doc)."""

    def __init__(self, whole_s: float = WHOLE_S, every_s: float = EVERY_S,
                 floor_s: float = FLOOR_S, clock: Callable[[], float] = time.time) -> None:
        self.whole_s, self.every_s, self.floor_s = whole_s, every_s, floor_s
        self._clock = clock
        self._began: dict[int, float] = {}  # generation: when it launched
        self._written: dict[tuple[int, str], float] = {}  # (generation, task): last line
        self._held: dict[tuple[int, str], _Held] = {}

    def lines(self, event: ev.Event) -> list[tuple[ev.Event, float | None]]:
        """The events to write for `event` told now: (event, its time; None: now)."""
        now = self._clock()
        if isinstance(event, ev.Launch):
            self._began[event.generation] = now
        if isinstance(event, ev.Progress):
            return self._progress(event, now)
        if isinstance(event, ev.TaskExited | ev.TaskRestarted):
            return [*self._release([(event.generation, event.task)]), (event, None)]
        if isinstance(event, ev.JobDone):
            return [*self._release(list(self._held)), (event, None)]
        return [(event, None)]

    def _progress(self, event: ev.Progress, now: float) -> list[tuple[ev.Event, float | None]]:
        key = (event.generation, event.task)
        last = self._written.get(key)
        gap = self._gap(event.generation, now)
        said = ProgressReport.read(event.metrics)
        # A resume point always (or one that cannot be read, a deleted backup); an
        # epoch's end or a save while the generation is young.
        marks = said.start or said.resumed is not None or said.resume_unknown is not None \
            or said.deleted is not None or (gap == self.floor_s and (
                said.epoch_end or said.checkpoint))
        if last is None or now - last >= gap or marks:
            self._written[key] = now
            held = self._held.pop(key, None)
            if held is not None and not said.has_step \
                    and ProgressReport.read(held.event.metrics).has_step:
                # A mark without a step (a deleted backup, a resume that cannot be
                # read) would drop the held report's step and loss: it goes first.
                return [*self._release_held(held), (event, None)]
            return [(_with(event, held) if held else event, None)]
        held = self._held.get(key)
        self._held[key] = _Held(event, now, *_carried(held, event.metrics),
                                saved=_saved(event.metrics) or (held.saved if held else None))
        return []

    def due(self) -> list[tuple[ev.Event, float | None]]:
        """The reports held back whose task may have its next line now (called
        on the supervisor's watch tick): a task that went quiet still shows
        its last report within a gap."""
        now = self._clock()
        keys = [key for key in self._held if now - self._written.get(key, now) >= self._gap(
            key[0], now)]
        for key in keys:
            self._written[key] = now
        return self._release(keys)

    def _gap(self, generation: int, now: float) -> float:
        began = self._began.setdefault(generation, now)
        return self.floor_s if now - began < self.whole_s else self.every_s

    def _release(self, keys: list[tuple[int, str]]) -> list[tuple[ev.Event, float | None]]:
        out: list[tuple[ev.Event, float | None]] = []
        for key in keys:
            held = self._held.pop(key, None)
            if held is not None:
                out += self._release_held(held)
        return out

    @staticmethod
    def _release_held(held: _Held) -> list[tuple[ev.Event, float | None]]:
        return [(_with(held.event, held, own=False), round(held.t, 6))]


def _carried(held: _Held | None, metrics: dict[str, Any]) -> tuple[float, bool]:
    """(save_s, checkpoint) of the reports held so far, with `metrics`'."""
    said = ProgressReport.read(metrics)
    save_s = (held.save_s if held else 0.0) + (said.save_s or 0.0)
    return save_s, (held.checkpoint if held else False) or said.checkpoint


def _with(event: ev.Progress, held: _Held, own: bool = True) -> ev.Progress:
    """`event`, also carrying what the held reports carried (`own`: plus its own)."""
    save_s, checkpoint = _carried(held, event.metrics) if own else (held.save_s, held.checkpoint)
    metrics = {**(held.saved or {}), **event.metrics}
    if save_s > 0:
        metrics["save_s"] = round(save_s, 4)
    if checkpoint:
        metrics["checkpoint"] = 1
    return replace(event, metrics=metrics)


def _saved(metrics: dict[str, Any]) -> dict[str, Any] | None:
    return {k: metrics[k] for k in ("saved", "saved_dir", "saved_with", "saved_by_runtime",
                                    "chief") if k in metrics} \
        if "saved" in metrics else None
