"""What the detectors find, as values the supervisor's loop acts on.

The detectors (job/detect/watch.py: silences, freezes, the start timeout and workers
out of step; job/lines/output.py: a collective abort in a task's output;
job/detect/radar.py: a straggler set aside) return a `Found` (a task failed: its
kind, how it was found, the facts) or a `HostSilent` (a host's agent stopped
talking); they call nothing of the supervisor, and word nothing: a failure's
words are its kind's (job/record/failkinds.py), filled in from the facts.
`Failures` turns a finding into the generation's `Failure` and tells it:
`failure_detected` for the first, `root_cause` when a later one is the real
cause.

Called from the supervisor thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..record import events as ev
from ..record.failkinds import Kind, say
from ..record.states import Failure, TaskRecord
from .blame import lost_peer_out_of_step
from .generation import Generation


@dataclass(frozen=True)
class Found:
    """A task's failure, as a detector found it: its kind, how it was found
    and the facts; its words are the kind's (job/record/failkinds.py), from those facts."""

    record: TaskRecord
    kind: Kind
    how: str  # a key of its kind's `words`
    facts: Mapping[str, Any] = field(default_factory=dict)  # what fills those words in
    last_lines: tuple[str, ...] = ()
    t: float | None = None  # Unix time it happened, as its host saw it (None: now)
    error: dict[str, Any] | None = None  # the Python exception the task reported

    @property
    def reason(self) -> str:
        """One phrase a user can act on."""
        return say(self.kind, self.how, self.facts)


@dataclass(frozen=True)
class HostSilent:
    """A host whose agent stopped talking: it is lost."""

    host: str
    detail: str


# ev.TailCut: a finished job's tail, cut (job/detect/tailcut.py).
Finding = Found | HostSilent | ev.TailCut


def root_cause(failure: Failure) -> ev.RootCause:
    """The event naming `failure` the generation's root cause."""
    return ev.RootCause(generation=failure.generation, task=failure.task.partition("/")[2],
                        host=failure.host, failure=failure.kind, reason=failure.reason,
                        **_details(failure))


def failure_detected(failure: Failure) -> ev.FailureDetected:
    """The event of a generation's first failure, with what the views show of it."""
    return ev.FailureDetected(generation=failure.generation,
                              task=failure.task.partition("/")[2], host=failure.host,
                              failure=failure.kind, reason=failure.reason, **_details(failure))


def restarted_alone(failure: Failure) -> ev.TaskRestarted:
    """The event of a ParameterServerStrategy worker's failure that the job
    survives (its worker restarted alone), with what the views show of it."""
    return ev.TaskRestarted(generation=failure.generation,
                            task=failure.task.partition("/")[2], host=failure.host,
                            failure=failure.kind, reason=failure.reason, **_details(failure))


def _details(failure: Failure) -> dict[str, Any]:
    """What status, the report and summary.json show of a failure beside its words."""
    return {"exit_code": failure.exit_code, "signal": failure.signal, "at": failure.t,
            "last_lines": failure.last_lines or None, "error": failure.error}


class Failures:
    """A generation's failures, from findings: the root cause kept (`Generation.consider`)."""

    def __init__(self, tell: Callable[[ev.Event], None], wall: Callable[[], float]) -> None:
        self._tell = tell
        self._wall = wall

    def of(self, gen: Generation, found: Found) -> Failure:
        record = found.record
        return Failure(
            task=record.task.label, host=record.task.host, generation=gen.plan.generation,
            t=found.t if found.t is not None else self._wall(), kind=found.kind,
            reason=found.reason, exit_code=record.exit_code, signal=record.signal,
            last_lines=found.last_lines, error=found.error,
        )

    def fail(self, gen: Generation, found: Found) -> None:
        """A failure of `found.record`. Its state moved by the event that told of
        it (an exit, a start failure, its host lost); a hung or aborting task is
        still running: it stays so until the teardown confirms its exit."""
        failure = self.of(gen, found)  # a lost peer's: maybe the workers out of step
        self.consider(gen, lost_peer_out_of_step(gen, failure) or failure)  # now FAILING

    def consider(self, gen: Generation, failure: Failure) -> None:
        """`failure` is a candidate root cause (one seen during the teardown, too):
        every generation's first failure is told, and each new root cause."""
        first = gen.failure is None
        if gen.consider(failure):  # a new root cause, after an earlier one
            self._tell(root_cause(failure))
        elif first:
            self._tell(failure_detected(failure))
