"""What runs across a job's generations: the restart budget, the failures
seen, the bad batches skipped, and the next restart counted (its backoff, its
`restart` event).

Pure bookkeeping over values; the supervisor thread owns the one `JobSoFar`.
The decisions themselves are launcher/job/policy/recovery.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..detect.sentinel import BatchSkip
from ..record import events as ev
from ..record.states import Failure, JobStatus
from .recovery import BACKOFF_RESET_S, Budget, backoff_delay


class Backoff(Protocol):  # what of the restart policy a restart reads
    max_restarts: int
    max_total_restarts: int
    backoff_s: float
    backoff_max_s: float


@dataclass
class JobSoFar:
    """What runs across generations: the restart budget and what it saw."""

    budget: Budget
    active: list[str]  # hosts of the next generation
    generation: int = 0
    restarts: int = 0
    backoff_attempt: int = 0  # restarts since the backoff was last reset
    failures: list[Failure] = field(default_factory=list)
    last_counted: bool = False  # the last restart counted against max_restarts
    skipped: list[BatchSkip] = field(default_factory=list)  # bad batches skipped, in order
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # the last generation's


@dataclass(frozen=True)
class End:
    """How the job ended (RunResult's status, message, stopped_by)."""

    status: JobStatus
    message: str = ""
    stopped_by: str = ""


def skip_batch(job: JobSoFar, skip: BatchSkip, max_skips: int) -> ev.BatchSkipped:
    """Add `skip` to the job's skipped batches (before the restart is counted:
    the next generation is the first to skip it); its event."""
    job.skipped.append(skip)
    return ev.BatchSkipped(generation=job.generation + 1, step=skip.step, epoch=skip.epoch,
                           batch=skip.batch, skips=len(job.skipped), max_skips=max_skips)


def count_restart(job: JobSoFar, policy: Backoff, *, counts: bool, advanced: bool,
                  trained_s: float, preempted: bool, skipped: bool = False,
                  free: str | None = None) -> ev.Restart:
    """Count the next restart in `job`; the `restart` event, with its backoff.
    `free`: the kind whose first failure in the job made it free (failkinds.free_first).
    The backoff always applies, doubling; a generation that trained for a
    while (`trained_s`) and advanced proves the failure was no loop: reset."""
    job.restarts += 1
    job.generation += 1
    job.last_counted = counts
    if advanced and trained_s >= BACKOFF_RESET_S:
        job.backoff_attempt = 0
    delay = backoff_delay(job.backoff_attempt, policy.backoff_s, policy.backoff_max_s)
    job.backoff_attempt += 1
    return ev.Restart(
        generation=job.generation, restarts=job.restarts, counted=counts, progress=advanced,
        hosts=tuple(job.active), backoff_s=delay, spent=job.budget.spent,
        max_restarts=policy.max_restarts, total=job.budget.total,
        max_total_restarts=policy.max_total_restarts, preempted=preempted,
        skipped=skipped or None, free=free)


def keras_switched(switch: dict[str, Any]) -> ev.KerasSwitched:
    """The event of keras_fallback.switched()'s record."""
    return ev.KerasSwitched(generation=switch["generation"], from_=switch["from"],
                            to=switch["to"], task=switch["task"], why=switch["why"])
