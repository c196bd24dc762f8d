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
stops the job, naming the step (skipping the batch would need the input's
exact position, which the launcher does not know).

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

    def hear(self, gen: Generation, record: TaskRecord, said: ProgressReport) -> Found | None:
        """A progress report of `record`'s task: the failure it is, if any."""
        generation = gen.plan.generation
        ids = {"generation": generation, "task": record.task.name, "host": record.task.host}
        failure = None
        if said.nonfinite is not None and generation not in self._loss:
            self._loss.add(generation)
            step, epoch, batch = said.nonfinite
            loss = said.nonfinite_loss or "non-finite"
            self._steps[generation] = step if step >= 0 else None
            self._tell(ev.Nonfinite(**ids, step=self._steps[generation], epoch=epoch,
                                    batch=batch, loss=loss))
            if gen.failure is None and gen.phase.running:  # stop before it saves NaN
                failure = Found(record, Kind.NONFINITE, "loss", {
                    "loss": loss, "step": step if step >= 0 else "?", "epoch_1": epoch + 1,
                    "batch_1": batch + 1})
        saved = said.saved_nonfinite
        if saved is not None and generation not in self._saves:
            self._saves.add(generation)
            self._tell(ev.NonfiniteSave(**ids, step=saved if saved >= 0 else None,
                                        directory=said.saved_dir or ""))
        return failure

    def judged(self, failures: list[Failure]) -> dict[str, Any]:
        """What the restart rules need after a generation stopped so
        (recovery.decide_restart): `free`, its first in the job; `again`, why
        the job stops (the same step went bad twice in a row)."""
        last = failures[-1] if failures else None
        if last is None or last.kind != Kind.NONFINITE:
            return {}
        step, before = self._steps.get(last.generation), self._steps.get(last.generation - 1)
        if step is not None and step == before:
            return {"again": (f"the loss went non-finite at step {step} again after the restart "
                              "from the last save before it: the bad input or state comes back "
                              "at that step (skipping its batch needs the input's exact "
                              "position, which the launcher does not know): fix the data or "
                              "the step, then launch again")}
        return {"free": not any(f.kind == Kind.NONFINITE for f in failures[:-1])}
