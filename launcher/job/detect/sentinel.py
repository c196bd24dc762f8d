"""The NaN sentinel, the launcher's side: a loss or a save gone non-finite, as
the tasks' bootstraps report it (launcher/runtime/sentinel.py), made events.

A task reports the first step whose loss went inf or NaN (`nonfinite`:
[step, epoch, batch], `nonfinite_loss`) and each save of non-finite weights
(`saved_nonfinite`: its step, `saved_dir`), which the runtime never reports as
a save. The first of each per generation is an event (`nonfinite`,
`nonfinite_save`), written to events.jsonl, worded in the terminal
(launcher/views/narrate.py), listed by `status` and summary.json and counted
by the metrics (`mgpu_nonfinite_total`). Keras logs the loss already reduced
across the workers, so every worker reports the same step: the event names
the task heard first.

A loss gone bad is also a failure of its own kind (`nonfinite`, job/record/failkinds.py):
training on would only save NaN weights (the bootstrap skips those saves), so
the generation is stopped and restarted from the last save, which is from
before the bad step. Not the script's bug: the first in a job is free of
`max_restarts` (`judged`). With the input's position carried (tf_keras,
runtime/epochinput.py) the replay reads the same batch at the same step, so a
bad batch is told apart from a one-off fault: the same step going bad again
after that restart is the batch's doing. Where the task said the skip is exact
(`nonfinite_exact`: a carried input, one batch a step), that batch is skipped:
the restart is free and every later generation reads it and drops it
(`BatchSkip`, a `batch_skipped` event; job/policy/batchskips.py), at most
`sentinel: {max_skips}` (default 2) in a job. A batch that comes back past
them, or where no skip is exact (Keras 3 starts its input again), stops the
job naming the step, the batches skipped and why no skip. Never a loop: a bad
step is replayed once before its batch is skipped or the job stops. Weights
refused at the same save in two generations in a row, no loss gone bad first
(a custom loop, a finite or unread loss: no step known to skip), stop the job
too, naming that save.

A replay that trains past the bad step, its batch not skipped, is told once
(`replay_passed`): a one-off fault (a device, a flipped bit), with the task that
reported it first; not the batch's where the replay read the same input there.

A loss spike (runtime/spikes.py: a finite step loss far above its recent
window) is a `loss_spike` event, once per generation and step, said and
counted; with `sentinel: {on_spike: rollback}` the task reports it as a
rollback and its first in a generation is handled as a loss gone non-finite
(the same failure kind, its own words).

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...spec.config import DEFAULT_MAX_SKIPS
from ..record import events as ev
from ..record.failkinds import Kind, free_first
from ..record.reports import ProgressReport
from ..record.states import Failure, TaskRecord
from .findings import Found
from .generation import Generation


@dataclass(frozen=True)
class BatchSkip:
    """A bad batch the job skips: its position in its epoch (epoch, batch, from
    0, as the `nonfinite` report numbers them) and the step it went bad at."""

    epoch: int
    batch: int
    step: int

    def __str__(self) -> str:  # counted from 1, as Keras' progress bar counts
        return f"batch {self.batch + 1} of epoch {self.epoch + 1} at step {self.step}"


class Sentinel:
    """The first non-finite loss and save of each generation, told as events;
    after a generation stopped so, the restart's terms (`judged`)."""

    def __init__(self, tell: Callable[[ev.Event], None],
                 max_skips: int = DEFAULT_MAX_SKIPS) -> None:
        self._tell = tell
        self.max_skips = max_skips  # `sentinel: {max_skips}`
        # generation: its bad step's position (epoch, batch) and why no skip is exact ("")
        self._where: dict[int, tuple[int, int, str]] = {}
        self._loss: set[int] = set()  # generations whose non-finite loss was told
        self._saves: set[int] = set()  # ...whose save of non-finite weights was
        self._steps: dict[int, int | None] = {}  # generation: its bad step (None: unknown)
        self._spiked: dict[int, str] = {}  # generations whose bad step was a spike's
        self._spike_steps: set[tuple[int, int]] = set()  # (generation, step) told
        self._first: dict[int, str] = {}  # generation: who reported its bad step first
        self._skipping: set[int] = set()  # bad steps whose batch later generations skip
        self._passed: set[int] = set()  # generations whose replay past the bad step was told
        self._skips_told: set[tuple[int, int, int]] = set()  # (generation, epoch, batch)
        self._past: set[int] = set()  # generations that resumed past their bad step: no replay
        # generation: the save its weights were refused at, where no loss went bad first
        # (a finite or unread loss), and how the loss was read then ("": a custom loop)
        self._refused: dict[int, tuple[int, str]] = {}

    def hear(self, gen: Generation, record: TaskRecord, said: ProgressReport) -> Found | None:
        """A progress report of `record`'s task: the failure it is, if any."""
        generation = gen.plan.generation
        ids = {"generation": generation, "task": record.task.name, "host": record.task.host}
        failure = None
        if said.nonfinite is not None and generation not in self._loss:
            self._loss.add(generation)
            step, epoch, batch = said.nonfinite
            loss = said.nonfinite_loss or "non-finite"
            self._steps.setdefault(generation, step if step >= 0 else None)
            self._where.setdefault(generation, (epoch, batch, _no_skip(said)))
            self._first.setdefault(generation, f"{record.task.host}/{record.task.name}")
            self._tell(ev.Nonfinite(**ids, step=self._steps[generation], epoch=epoch,
                                    batch=batch, loss=loss))
            if gen.failure is None and gen.phase.running:  # stop before it saves NaN
                failure = Found(record, Kind.NONFINITE, "loss", {
                    "loss": loss, "step": step if step >= 0 else "?", "epoch_1": epoch + 1,
                    "batch_1": batch + 1})
        failure = failure or self._spike(gen, record, said, ids)
        self._replayed(generation, said)
        self._skip_done(said, ids)
        saved = said.saved_nonfinite
        if saved is not None and generation not in self._saves:  # told once
            self._saves.add(generation)
            self._tell(ev.NonfiniteSave(**ids, step=saved if saved >= 0 else None,
                                        directory=said.saved_dir or "",
                                        after_spike=said.saved_after_spike or None))
        # Each judged, not only the first: a later one may roll back (its task holds).
        if saved is not None and failure is None and _rolls_back(said) \
                and gen.failure is None and gen.phase.running:
            self._refused.setdefault(generation, (saved, said.saved_loss or ""))
            failure = Found(record, Kind.NONFINITE,
                            "weights" if said.saved_loss == "finite" else "save", {
                                "step": saved if saved >= 0 else "?",
                                "directory": said.saved_dir or "its checkpoint directory"})
        return failure

    def _spike(self, gen: Generation, record: TaskRecord, said: ProgressReport,
               ids: dict[str, Any]) -> Found | None:
        """A loss spike (each the task reports: a few at most); with
        `on_spike: rollback` the first of a generation stops it as a loss gone
        non-finite does (its step remembered: the same step again stops the job)."""
        generation = gen.plan.generation
        if said.loss_spike is None or (generation, said.loss_spike[0]) in self._spike_steps:
            return None  # every worker logs the same reduced loss: told once
        step, epoch, batch = said.loss_spike
        self._spike_steps.add((generation, step))
        loss, median = said.loss_spike_loss or 0.0, said.loss_spike_median or 0.0
        z = said.loss_spike_z or 0.0
        rollback = said.loss_spike_rollback
        self._tell(ev.LossSpike(**ids, step=step, epoch=epoch, batch=batch, loss=loss,
                                median=median, z=z, rollback=rollback))
        if not rollback or generation in self._steps:
            return None
        self._steps[generation] = step
        self._where[generation] = (epoch, batch, _no_skip(said))
        self._spiked[generation] = "spiked"
        if gen.failure is not None or not gen.phase.running:
            return None
        return Found(record, Kind.NONFINITE, "spike", {
            "loss": loss, "step": step, "epoch_1": epoch + 1, "batch_1": batch + 1,
            "median": median, "z": z})

    def _replayed(self, generation: int, said: ProgressReport) -> None:
        """The replay after a rollback past the step that went bad in the
        generation before, its batch not skipped: a one-off fault, told once.
        Past it means a save after it (checked finite: runtime/sentinel.py); a
        step report alone may come before the report of the same step gone bad
        again (the loss is read a step late, Keras 3's callbacks off the thread)."""
        bad = self._steps.get(generation - 1)
        if bad is not None and said.resumed is not None and said.resumed >= bad:
            self._past.add(generation)  # a finite save past it (mixed precision): no replay
        if bad is None or said.saved is None or said.saved <= bad or generation in self._steps \
                or generation in self._past | self._passed or bad in self._skipping:
            return
        self._passed.add(generation)
        exact = not self._where.get(generation - 1, (0, 0, "unknown"))[2]
        self._tell(ev.ReplayPassed(generation=generation, step=bad, exact=exact,
                                   first=self._first.get(generation - 1, "")))

    def _skip_done(self, said: ProgressReport, ids: dict[str, Any]) -> None:
        """A skip as a task did it (or a batch trained in its place), told once
        per generation and position: the first task that says so."""
        for position, done in ((said.skip_done, True), (said.skip_not, False)):
            if position is None:
                continue
            step, epoch, batch = position
            if (ids["generation"], epoch, batch) in self._skips_told:
                continue
            self._skips_told.add((ids["generation"], epoch, batch))
            self._tell(ev.BatchSkipDone(**ids, epoch=epoch, batch=batch, done=done,
                                        step=step if step >= 0 else None))

    def judged(self, failures: list[Failure],
               skipped: Sequence[BatchSkip] = ()) -> dict[str, Any]:
        """What the restart rules need after a generation stopped so
        (recovery.decide_restart): `free`, its first in the job; when the same
        step went bad twice in a row, `skip`, its batch (exact, not skipped
        before, fewer than `max_skips` in `skipped`), or `again`, why the job
        stops (so too weights refused at the same save twice in a row)."""
        last = failures[-1] if failures else None
        if last is None or last.kind != Kind.NONFINITE:
            return {}
        step, before = self._steps.get(last.generation), self._steps.get(last.generation - 1)
        if step is None and before is None and len(failures) > 1 \
                and failures[-2].kind == Kind.NONFINITE \
                and failures[-2].generation == last.generation - 1:
            again = _refused_again(self._refused.get(last.generation),
                                   self._refused.get(last.generation - 1))
            if again:
                return {"again": again}
        if step is None or step != before:
            return {"free": free_first([f.kind for f in failures])}
        epoch, batch, why = self._where.get(last.generation, (0, 0, "its position is unknown"))
        bad = BatchSkip(epoch, batch, step)
        seen = (epoch, batch) in {(s.epoch, s.batch) for s in skipped}
        if not why and not seen and len(skipped) < self.max_skips:
            self._skipping.add(step)
            return {"skip": bad}
        went = self._spiked.get(last.generation, "went non-finite")
        return {"again": (f"the loss {went} at step {step} again after the restart from the "
                          "last save before it: the bad input or state comes back at that "
                          f"step; {self._no_skip_words(bad, why, seen, skipped)}")}

    def _no_skip_words(self, bad: BatchSkip, why: str, seen: bool,
                       skipped: Sequence[BatchSkip]) -> str:
        """Why `bad`'s batch is not skipped (naming those that were), and the fix."""
        fix = "fix the data or the step, then launch again"
        if why:
            return f"its batch is not skipped: {why}: {fix}"
        if seen:
            return (f"{bad} was skipped already, so the cause is not that batch (or its task "
                    f"could not skip it: its output says why): {fix}")
        if not self.max_skips:
            return (f"{bad} is not skipped: sentinel.max_skips is 0 (`sentinel: {{max_skips: "
                    f"{DEFAULT_MAX_SKIPS}}}` skips up to {DEFAULT_MAX_SKIPS} bad batches): {fix}")
        return (f"{bad} is not skipped: sentinel.max_skips={self.max_skips} bad batches were "
                f"skipped already ({'; '.join(map(str, skipped))}): {fix}, or allow more "
                "skips (sentinel.max_skips)")


def _rolls_back(said: ProgressReport) -> bool:
    """A refused save of non-finite weights (`said.saved_nonfinite`) that stops
    the generation: weights gone bad in a custom loop (its loss is its own: any
    worker's, the all-reduce spreads a NaN), or in a `fit` whose loss stayed
    finite or is not read, on the chief (`said.saved_loss`: the chief's saves
    are the job's; a worker's own NaN, a fused ReLU's, leaves them good and is a
    warning), else every later save would be refused and the job end
    "succeeded" on NaN weights.
    Not where that step's loss went bad: its report, told first, names the
    step for the replay and the skip. Not a save made and still its
    directory's newest (`tf.train.Checkpoint.write`, or a `save` whose state
    file could not be rewritten): the restart would restore those very
    weights. Not a finite save after a spike."""
    loss_allows = not said.saved_loss or (said.saved_loss != "bad" and said.chief)
    return (said.save_skipped or said.save_set_aside) and loss_allows \
        and not said.saved_after_spike


def _refused_again(now: tuple[int, str] | None, before: tuple[int, str] | None) -> str:
    """Why the job stops when weights went non-finite before the same save in
    two generations in a row, its loss not gone bad first ("": they did not):
    the replay from the save before it spoiled them again, so the cause comes
    back; no batch can be skipped, for no step is known to be the bad one."""
    if now is None or before is None or now[0] != before[0] or now[0] < 0:
        return ""
    step, loss = now
    unknown = ("the loss of a custom loop is its own, not read" if not loss else
               "its loss stayed finite" if loss == "finite" else "its loss is not read")
    return (f"the weights were not finite at the save of step {step} again after the restart "
            "from the last save before it: the bad input or state comes back before that "
            f"save; no batch is skipped: {unknown}, so which step spoiled them is not known "
            "(a NaN in a BatchNormalization's moving statistics, a weight the loss does not "
            "read): fix the data or the step, then launch again (the checkpoints before it "
            "are kept)")


def _no_skip(said: ProgressReport) -> str:
    """Why the task said its bad step's batch cannot be skipped exactly ("": it can)."""
    if said.nonfinite_exact:
        return ""
    return said.nonfinite_inexact or "its task did not say that its input's position is carried"
