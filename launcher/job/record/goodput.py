"""The goodput ledger: where a run's wall-clock time went, from its typed events.

`ledger(events, now)` (or a `Ledger` fed one event at a time) is a pure
function of the run's story (the events of
`events.jsonl`, read back with `eventlines.from_record`): the same answer for
`summary.json` (written when the run ends) and for `mgpu-launch status` of a
running job (`now`: the moment asked). Its parts, in seconds, add up to
`wall_s`:

- `startup`: the launcher's start to the first training step;
- `training`: steps trained for the first time (`productive_s`);
- `redone`: training time spent on steps already trained before a failure
  (the next generation resumed from an earlier checkpoint, or from scratch):
  the steps from the resume point to the highest step reported before, timed
  at the restarted generation's own step rate;
- `recovery`: a fault to the first step of the next generation (teardown,
  backoff, start-up of the new tasks, the restore);
- `waiting_for_hosts`: a lost host waited for (`restart.on_host_loss: wait`),
  carved out of the recovery;
- `checkpointing`: saves timed by the runtime (`save_s` of the progress
  reports: BackupAndRestore, ModelCheckpoint, CheckpointManager.save,
  `report_checkpoint(step, save_s=...)`), carved out of training and redone;
- `other`: the rest (after the last step: final saves, exits, teardown).

Steps are job-wide: the highest step any task reported. A step report is
global (the optimizer's count, `counted`, or a custom loop's own step) except
those of `runtime.callbacks()`, which count this process's batches from the
resume point its first report names (`start_step`). A generation's first step
is the first report past its resume point (`start_step`; for a restarted
script that reports nothing itself, the first count read off its optimizer,
which may be the restored count itself).

Pure: no I/O, no clock. Must not import views, commands or cli.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from . import eventlines
from . import events as ev
from .reports import ProgressReport

PARTS = ("training", "startup", "recovery", "redone", "checkpointing",
         "waiting_for_hosts", "other")

_FAULTS = (ev.FailureDetected, ev.HostLost)
_ENDS = (ev.StopRequested, ev.TeardownBegun)


@dataclass
class _Gen:
    """What the ledger needs of one generation (kept as the events pass: a
    week of progress reports is never held)."""

    high: int = 0  # the highest step trained before this generation
    resume: int | None = None  # the step it resumed at, when known
    first_step_t: float | None = None
    first: tuple[float, int] | None = None  # the first (t, job-wide step) past the resume
    fault_t: float | None = None
    end_t: float | None = None  # a stop asked, or a teardown begun
    last: tuple[float, int] | None = None  # the last (t, job-wide step)
    caught_up_t: float | None = None  # when its steps passed `high`
    saves: list[tuple[float, float]] = field(default_factory=list)  # (start, end)
    restored: int | None = None  # the first generation's: the step it said it restored


def ledger(events: Iterable[ev.Event], now: float | None = None) -> dict[str, Any] | None:
    """`{wall_s, productive_s, parts: {...}}` of a run (None: nothing launched yet).

    `now`: the moment of a running job (its last event's time when None); a
    finished run ends at its `job_done`.
    """
    book = Ledger()
    for event in events:
        book.add(event)
    return book.result(now)


class Ledger:
    """The ledger kept as the events come (a view may `add` each event it is
    told, with the time it was told: told events carry no `t`)."""

    def __init__(self) -> None:
        self._gens: dict[int, _Gen] = {}
        self._waits = _Waits()
        self._start: float | None = None
        self._end: float | None = None  # the job_done's time
        self._last_t: float | None = None
        self._bases: dict[tuple[int, str], int] = {}

    def add(self, event: ev.Event, t: float | None = None) -> None:
        t = event.t if event.t is not None else t
        if t is None:
            return
        self._last_t = t
        if self._start is None and isinstance(event, ev.Launch):
            self._start = t
        if isinstance(event, ev.JobDone):
            self._end = t
            self._start = min(self._start if self._start is not None else t, t - event.wall_s)
        self._waits.on(event, t)
        generation = getattr(event, "generation", None)
        if not isinstance(generation, int):
            return
        gen = self._gens.get(generation)
        if gen is None:
            gen = self._gens[generation] = _Gen(high=max(
                (g.last[1] for n, g in self._gens.items() if n < generation and g.last),
                default=0))
        if isinstance(event, _FAULTS) and gen.fault_t is None:
            gen.fault_t = t
        elif isinstance(event, _ENDS) and gen.end_t is None:
            gen.end_t = t
        elif isinstance(event, ev.Progress):
            _on_progress(gen, event, t, self._bases)

    def result(self, now: float | None = None) -> dict[str, Any] | None:
        """The ledger so far (`now`: see `ledger`)."""
        if self._start is None or self._last_t is None:
            return None
        done = self._end is not None
        end = self._end if self._end is not None else max(
            self._last_t, now if now is not None else self._last_t)
        return _account(self._start, end, done, self._gens, self._waits.spans(end))


class _Waits:
    """The time spent waiting for lost hosts: from a host's loss to its return
    (`host_back`), or, when the launcher waited for it (`host_wait`) in vain,
    to the next launch."""

    def __init__(self) -> None:
        self._lost: dict[str, float] = {}
        self._open: dict[str, float] = {}  # host: waited for since
        self._closed: list[tuple[float, float]] = []

    def on(self, event: ev.Event, t: float) -> None:
        if isinstance(event, ev.HostLost):
            self._lost[event.host] = t
        elif isinstance(event, ev.HostWait):
            self._open.setdefault(event.host, self._lost.get(event.host, t))
        elif isinstance(event, ev.HostBack):
            since = self._open.pop(event.host, self._lost.get(event.host))
            if since is not None:
                self._closed.append((since, t))
            self._lost.pop(event.host, None)
        elif isinstance(event, ev.Launch):
            self._closed += [(since, t) for since in self._open.values()]
            self._open.clear()
            self._lost.clear()

    def spans(self, end: float) -> list[tuple[float, float]]:
        return sorted([*self._closed, *((since, end) for since in self._open.values())])


def _on_progress(gen: _Gen, event: ev.Progress, t: float,
                 bases: dict[tuple[int, str], int]) -> None:
    r = ProgressReport.read(event.metrics)
    if r.save_s and r.save_s > 0:
        gen.saves.append((t - r.save_s, t))
    if gen.restored is None and event.generation == 0:  # later ones: `resume`
        gen.restored = r.resumed if r.resumed is not None else (
            r.start_step if r.start and not r.counted else None)
    if r.resumed is not None and event.generation > 0 and gen.resume is None:
        gen.resume = r.resumed  # read where the restore happened
    if r.own_step is None:
        return
    key = (event.generation, event.task)
    if r.start:  # where a restarted fit resumed: no step trained yet
        if r.start_step is not None and not r.counted:
            bases[key] = r.start_step - r.own_step
            gen.resume = r.start_step
        return
    step = r.own_step + (0 if r.counted else bases.get(key, 0))
    if gen.resume is None and event.generation > 0 and r.counted:
        gen.resume = step  # the restored count, read as (or before) training went on
    if gen.resume is not None and step <= gen.resume:
        return  # no step trained in this generation yet
    if gen.first_step_t is None:
        gen.first_step_t, gen.first = t, (t, step)
    if gen.caught_up_t is None and step >= gen.high:
        if gen.last is None or gen.last[1] >= step:
            gen.caught_up_t = gen.first_step_t if gen.last is None else t
        else:  # between two reports: where the step count passed `high`
            t0, s0 = gen.last
            gen.caught_up_t = t0 + (t - t0) * (gen.high - s0) / (step - s0)
    if gen.last is None or step > gen.last[1]:
        gen.last = (t, step)
    else:
        gen.last = (t, gen.last[1])


def _account(start: float, end: float, done: bool, gens: dict[int, _Gen],
             waits: list[tuple[float, float]]) -> dict[str, Any]:
    """Label the time from `start` to `end`, then carve out waits and saves."""
    spans: list[tuple[float, float, str]] = []  # (from, to, part), in order
    cursor, mode = start, "startup"
    numbers = sorted(gens)
    for index, number in enumerate(numbers):
        gen = gens[number]
        later = index + 1 < len(numbers)
        if gen.first_step_t is None:
            if gen.fault_t is not None and mode == "startup":
                spans.append((cursor, gen.fault_t, mode))
                cursor, mode = gen.fault_t, "recovery"
            continue
        stop = _training_end(gen, later, done, end)
        began, caught_up = _redone(gen, cursor, stop)
        spans.append((cursor, began, mode))
        spans.append((began, caught_up, "redone"))
        spans.append((caught_up, stop, "training"))
        cursor, mode = stop, "recovery" if gen.fault_t is not None or later else "other"
    if done and mode == "recovery":  # the job ended after its last fault
        mode = "other"
    spans.append((cursor, end, mode))
    spans = _clip(spans, start, end)
    spans = _overlay(spans, waits,
                     "waiting_for_hosts", ("startup", "recovery", "other"))
    spans = _overlay(spans, _saves(gens), "checkpointing", ("training", "redone"))
    parts = dict.fromkeys(PARTS, 0.0)
    for a, b, part in spans:
        parts[part] += b - a
    wall = max(end - start, 0.0)
    parts["other"] += wall - sum(parts.values())  # rounding only: the spans tile the run
    rounded = {k: round(max(v, 0.0), 3) for k, v in parts.items()}
    return {"wall_s": round(wall, 3), "productive_s": rounded["training"], "parts": rounded,
            "steps": _steps(gens)}


def _steps(gens: dict[int, _Gen]) -> dict[str, Any]:
    """The steps behind the seconds: the job's highest step, and per
    generation where it resumed, how far it got and how many steps it trained
    again (None where unknown: a restarted generation's resume not read)."""
    rows = []
    for number in sorted(gens):
        gen = gens[number]
        # The first generation starts from 0 unless it said it restored a save.
        resumed = (gen.restored or 0) if number == 0 else gen.resume
        reached = gen.last[1] if gen.last else None
        redone = None  # the steps from its resume up to where it or the earlier ones stopped
        if resumed is not None:
            redone = max(0, min(gen.high, resumed if reached is None else reached) - resumed)
        rows.append({"generation": number, "resumed_at": resumed, "reached": reached,
                     "redone": redone})
    reached = [row["reached"] for row in rows if row["reached"] is not None]
    return {"reached": max(reached, default=None), "generations": rows}


def _redone(gen: _Gen, cursor: float, stop: float) -> tuple[float, float]:
    """(when the generation's training began, when it caught up with `high`).

    With a resume point and two step reports: the steps from the resume point
    to the first report, and from the resume point to `high` (redone), timed
    at the generation's own step rate, however far apart its reports are.
    Else: from its first report to where the reports passed `high`."""
    assert gen.first_step_t is not None
    if gen.resume is not None and gen.first is not None and gen.last is not None \
            and gen.last[1] > gen.first[1]:
        (t0, s0), (t1, s1) = gen.first, gen.last
        per_step = (t1 - t0) / (s1 - s0)
        began = min(max(cursor, t0 - (s0 - gen.resume) * per_step), t0)
        return began, min(stop, began + max(0, gen.high - gen.resume) * per_step)
    caught_up = min(stop, gen.caught_up_t if gen.caught_up_t is not None else stop)
    return gen.first_step_t, caught_up


def _training_end(gen: _Gen, later: bool, done: bool, end: float) -> float:
    """When this generation stopped training: its fault, a stop or teardown,
    else its last step (a finished run), else now (a running one)."""
    marks = [t for t in (gen.fault_t, gen.end_t) if t is not None and t >= gen.first_step_t]
    if marks:
        return min(marks)
    if later or done:
        return gen.last[0] if gen.last is not None else gen.first_step_t
    return end


def _clip(spans: list[tuple[float, float, str]], start: float,
          end: float) -> list[tuple[float, float, str]]:
    out = []
    for a, b, part in spans:
        a, b = max(a, start), min(b, end)
        if b > a:
            out.append((a, b, part))
    return out


def _saves(gens: dict[int, _Gen]) -> list[tuple[float, float]]:
    """The save intervals of every task, merged (tasks save together)."""
    merged: list[list[float]] = []
    for a, b in sorted(s for gen in gens.values() for s in gen.saves):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _overlay(spans: list[tuple[float, float, str]], cover: list[tuple[float, float]],
             part: str, over: tuple[str, ...]) -> list[tuple[float, float, str]]:
    """Relabel as `part` the time of `cover` that falls in spans labelled `over`."""
    if not cover:
        return spans
    out: list[tuple[float, float, str]] = []
    for a, b, label in spans:
        if label not in over:
            out.append((a, b, label))
            continue
        cursor = a
        for c, d in cover:
            c, d = max(c, cursor), min(d, b)
            if d <= c:
                continue
            out.append((cursor, c, label))
            out.append((c, d, part))
            cursor = d
        out.append((cursor, b, label))
    return [s for s in out if s[1] > s[0]]


def from_records(records: Iterable[dict[str, Any]], now: float | None = None
                 ) -> dict[str, Any] | None:
    """The ledger of the lines of events.jsonl (dicts, as read)."""
    return ledger((eventlines.from_record(r) for r in records), now)
