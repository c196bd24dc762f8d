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
`max_restarts` (`judged`); the same step going bad again after that restart
stops the job, naming the step: with the input's position carried (tf_keras,
runtime/epochinput.py) the replay reads the same batch at the same step, so a
bad batch is told apart from a one-off fault; the launcher does not skip it
(yet).

A loss spike (runtime/spikes.py: a finite step loss far above its recent
window) is a `loss_spike` event, once per generation and step, said and
counted; with `sentinel: {on_spike: rollback}` the task reports it as a
rollback and its first in a generation is handled as a loss gone non-finite
(the same failure kind, its own words).

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..record import events as ev
from ..record.failkinds import Kind
from ..record.reports import ProgressReport
from ..record.states import Failure, TaskRecord
from .findings import Found
from .generation import Generation


class Sentinel:
    """The first non-finite loss and save of each generation, told as events."""

    def __init__(self, tell: Callable[[ev.Event], None]) -> None:
        self._tell = tell
        self._loss: set[int] = set()  # generations whose non-finite loss was told
        self._saves: set[int] = set()  # ...whose save of non-finite weights was
        self._steps: dict[int, int | None] = {}  # generation: its bad step (None: unknown)
        self._spiked: dict[int, str] = {}  # generations whose bad step was a spike's
        self._spike_steps: set[tuple[int, int]] = set()  # (generation, step) told

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
            self._tell(ev.Nonfinite(**ids, step=self._steps[generation], epoch=epoch,
                                    batch=batch, loss=loss))
            if gen.failure is None and gen.phase.running:  # stop before it saves NaN
                failure = Found(record, Kind.NONFINITE, "loss", {
                    "loss": loss, "step": step if step >= 0 else "?", "epoch_1": epoch + 1,
                    "batch_1": batch + 1})
        failure = failure or self._spike(gen, record, said, ids)
        saved = said.saved_nonfinite
        if saved is not None and generation not in self._saves:
            self._saves.add(generation)
            self._tell(ev.NonfiniteSave(**ids, step=saved if saved >= 0 else None,
                                        directory=said.saved_dir or "",
                                        after_spike=said.saved_after_spike or None))
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
        self._spiked[generation] = "spiked"
        if gen.failure is not None or not gen.phase.running:
            return None
        return Found(record, Kind.NONFINITE, "spike", {
            "loss": loss, "step": step, "epoch_1": epoch + 1, "batch_1": batch + 1,
            "median": median, "z": z})

    def judged(self, failures: list[Failure]) -> dict[str, Any]:
        """What the restart rules need after a generation stopped so
        (recovery.decide_restart): `free`, its first in the job; `again`, why
        the job stops (the same step went bad twice in a row)."""
        last = failures[-1] if failures else None
        if last is None or last.kind != Kind.NONFINITE:
            return {}
        step, before = self._steps.get(last.generation), self._steps.get(last.generation - 1)
        if step is not None and step == before:
            went = self._spiked.get(last.generation, "went non-finite")
            return {"again": (f"the loss {went} at step {step} again after the restart "
                              "from the last save before it: the bad input or state comes back "
                              "at that step (the launcher does not skip a batch): fix the data "
                              "or the step, then launch again")}
        return {"free": not any(f.kind == Kind.NONFINITE for f in failures[:-1])}
