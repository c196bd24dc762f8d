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

Pure bookkeeping over progress records; no I/O. Owned by the supervisor thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import events as ev
from .reports import ProgressReport


class Sentinel:
    """The first non-finite loss and save of each generation, told as events."""

    def __init__(self, tell: Callable[[ev.Event], None]) -> None:
        self._tell = tell
        self._loss: set[int] = set()  # generations whose non-finite loss was told
        self._saves: set[int] = set()  # ...whose save of non-finite weights was

    def hear(self, ids: dict[str, Any], said: ProgressReport) -> None:
        """A progress report of the task `ids` names (generation, task, host)."""
        generation = ids["generation"]
        if said.nonfinite is not None and generation not in self._loss:
            self._loss.add(generation)
            step, epoch, batch = said.nonfinite
            self._tell(ev.Nonfinite(**ids, step=step if step >= 0 else None, epoch=epoch,
                                    batch=batch, loss=said.nonfinite_loss or ""))
        saved = said.saved_nonfinite
        if saved is not None and generation not in self._saves:
            self._saves.add(generation)
            self._tell(ev.NonfiniteSave(**ids, step=saved if saved >= 0 else None,
                                        directory=said.saved_dir or ""))
