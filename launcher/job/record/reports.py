"""A task's progress report, read in one place into a typed, frozen record.

The runtime and the bootstrap send each report as a JSON object (launcher/
runtime/: the step counter, the saves and restores hooks, `report_progress`),
checked by job/run/protocol.py and kept as it came in `events.jsonl`. What its keys
mean is said here once, and every module that judges or shows a report (the
supervisor, resumes, history, goodput, the story, the report's rates, the
radar, the tail cut, the samples written) reads this record, never the keys.
A fact the report does not hold is None: unknown, never 0.

The steps: `step` is the job's (absolute) step where the launcher read it
(`job_step`, job/detect/resumes.py: `runtime.callbacks()` counts a generation's steps
from 0 and says once where it started); a run directory written before it has
the step as the task counted it (`own_step`) only.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ProgressReport:
    """One progress report of a task. None: not in the report (unknown)."""

    step: int | None = None  # the job's step (absolute), where the launcher read it
    own_step: int | None = None  # the step as the report counted it
    counted: bool = False  # read off the optimizer (runtime/steps.py): the job's count already
    start: bool = False  # runtime.callbacks()' first epoch, before a step (`start_epoch`)
    start_step: int | None = None  # where that first epoch began (a restored count)
    epoch: float | None = None
    epoch_end: bool = False
    checkpoint: bool = False  # a save was reported (its step may be unknown)
    saved: int | None = None  # a completed save's step (runtime/saves.py)
    saved_dir: str | None = None
    chief: bool = False  # the save was the chief's
    save_s: float | None = None  # the seconds the saves since the last report took
    resumed: int | None = None  # the step the restore left the optimizer at
    resumed_epoch: int | None = None
    resumed_dir: str | None = None
    resume_unknown: str | None = None  # a restore whose step cannot be read: why
    deleted: str | None = None  # the backup directory `fit` deleted at its end
    # With the memory tier (runtime/memtier.py): the copy a restore read,
    # memory|peer|shared, its host and path.
    resumed_from: str | None = None
    resumed_host: str | None = None
    resumed_copy: str | None = None
    # A checkpoint that could not be read, passed over (runtime/readable.py): its
    # path, why, where its files are kept, and the one restored instead.
    passed_over: str | None = None
    passed_over_why: str | None = None
    passed_over_to: str | None = None
    passed_over_for: str | None = None
    loss: float | None = None
    steps_per_s: float | None = None
    # The NaN sentinel (runtime/sentinel.py): the step whose loss went non-finite,
    # (step, epoch, batch), the step -1 when not read; the mean then ("inf", "nan");
    # a save of non-finite weights (its step, -1: not read), made or skipped.
    nonfinite: tuple[int, int, int] | None = None
    nonfinite_loss: str | None = None
    # Whether the launcher may skip that step's batch by its position (a rollback
    # spike's too): exact (tf_keras, a carried input, one batch a step), or why not.
    nonfinite_exact: bool = False
    nonfinite_inexact: str | None = None
    saved_nonfinite: int | None = None
    save_skipped: bool = False
    save_set_aside: bool = False  # ...made, then no longer its directory's newest
    saved_after_spike: bool = False  # that save's weights finite, trained past a spike
    # ...in a `fit`: "bad" (its loss went bad: that report decides), "finite"
    # (weights gone bad that the loss does not show) or "unwatched" (not read).
    saved_loss: str | None = None
    # A loss spike (runtime/spikes.py): (step, epoch, batch), the step's own loss,
    # the window's median, the robust z-score; rollback: `on_spike: rollback`.
    loss_spike: tuple[int, int, int] | None = None
    loss_spike_loss: float | None = None
    loss_spike_median: float | None = None
    loss_spike_z: float | None = None
    loss_spike_rollback: bool = False
    drill_nan: int | None = None  # the drill's NaN went into this task's weights at this step
    # A batch the launcher skips, as the task did it (runtime/epochinput.py):
    # (step, epoch, batch) dropped, not trained; or trained in its place (another
    # `fit` at that position, at another step).
    skip_done: tuple[int, int, int] | None = None
    skip_not: tuple[int, int, int] | None = None
    # The program's life (launcher/bootstrap.py): its script returned, the program
    # ended cleanly, the cluster it is joining or joined; a position (`at`).
    returned: bool = False
    over: bool = False
    cluster: str | None = None
    position: bool = False

    @classmethod
    def read(cls, metrics: Mapping[str, Any]) -> ProgressReport:
        own = _int(metrics.get("step"))
        job = _int(metrics.get("job_step"))
        cluster = metrics.get("cluster")
        return cls(
            step=job if job is not None else own, own_step=own,
            counted=bool(metrics.get("counted")), start=bool(metrics.get("start_epoch")),
            start_step=_int(metrics.get("start_step")), epoch=_number(metrics.get("epoch")),
            epoch_end=bool(metrics.get("epoch_end")), checkpoint=bool(metrics.get("checkpoint")),
            saved=_int(metrics.get("saved")), saved_dir=_text(metrics.get("saved_dir")),
            chief=bool(metrics.get("chief")), save_s=_number(metrics.get("save_s")),
            resumed=_int(metrics.get("resumed")),
            resumed_epoch=_int(metrics.get("resumed_epoch")),
            resumed_dir=_text(metrics.get("resumed_dir")),
            resume_unknown=_text(metrics.get("resumed_unknown")),
            deleted=_text(metrics.get("deleted")),
            resumed_from=_text(metrics.get("resumed_from")),
            resumed_host=_text(metrics.get("resumed_host")),
            resumed_copy=_text(metrics.get("resumed_copy")),
            passed_over=_text(metrics.get("passed_over")),
            passed_over_why=_text(metrics.get("passed_over_why")),
            passed_over_to=_text(metrics.get("passed_over_to")),
            passed_over_for=_text(metrics.get("passed_over_for")),
            loss=_number(metrics.get("loss")),
            steps_per_s=_number(metrics.get("steps_per_s")),
            nonfinite=_position(metrics.get("nonfinite")),
            nonfinite_loss=_text(metrics.get("nonfinite_loss")),
            nonfinite_exact=bool(metrics.get("nonfinite_exact")),
            nonfinite_inexact=_text(metrics.get("nonfinite_inexact")),
            saved_nonfinite=_int(metrics.get("saved_nonfinite")),
            save_skipped=bool(metrics.get("save_skipped")),
            save_set_aside=bool(metrics.get("save_set_aside")),
            saved_after_spike=bool(metrics.get("saved_after_spike")),
            saved_loss=_text(metrics.get("saved_loss")),
            loss_spike=_position(metrics.get("loss_spike")),
            loss_spike_loss=_number(metrics.get("loss_spike_loss")),
            loss_spike_median=_number(metrics.get("loss_spike_median")),
            loss_spike_z=_number(metrics.get("loss_spike_z")),
            loss_spike_rollback=bool(metrics.get("loss_spike_rollback")),
            drill_nan=_int(metrics.get("drill_nan")),
            skip_done=_position(metrics.get("skip_done")),
            skip_not=_position(metrics.get("skip_not")),
            returned=bool(metrics.get("returned")), over=bool(metrics.get("over")),
            cluster=cluster if cluster in ("joining", "joined") else None,
            position="at" in metrics)

    @property
    def has_step(self) -> bool:
        return self.own_step is not None

    @property
    def position_only(self) -> bool:
        """Where the task is, and nothing else to show or count (no step, no
        save, even one whose step is unknown, no resume point, no deleted backup)."""
        return self.position and not self.has_step and self.saved is None \
            and not self.checkpoint and self.resumed is None \
            and self.resume_unknown is None and self.deleted is None \
            and self.passed_over is None and self.drill_nan is None \
            and self.skip_done is None and self.skip_not is None

    @property
    def resume_point(self) -> int | None:
        """The step this report names as where its task resumed (None: it names
        none): the restore's, runtime.callbacks()' first epoch's, or a custom
        loop's own first step. The optimizer's count seconds into training
        (`counted`), a save, or a fit with no step read name none."""
        if self.resumed is not None:
            return self.resumed
        if self.start:
            return self.start_step
        if self.counted or self.saved is not None:
            return None
        return self.own_step


def _number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _position(value: Any) -> tuple[int, int, int] | None:
    """[step, epoch, batch], as a list of three integers (job/run/protocol.py keeps them)."""
    if isinstance(value, list) and len(value) == 3 and all(_int(v) is not None for v in value):
        step, epoch, batch = (int(v) for v in value)
        return step, epoch, batch
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None
