"""Every wait has an end: hosts whose agent stopped talking, tasks that stopped
making progress or were frozen, workers alive but out of step (named as soon
as the whole job has been quiet long enough: job/detect/lockstep.py), a job that
did not get going, and one that is done but for a task TensorFlow holds back
(job/detect/tailcut.py).

Pure checks over the generation and the clock; what they find is returned,
a `Found` (a task's failure) or a `HostSilent` (job/detect/findings.py), and the
supervisor's loop acts on it. Called from the supervisor thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ...transport import AgentLink
from ..record import events as ev
from ..record.failkinds import Kind, say
from ..record.phases import Phase
from ..record.states import TaskRecord, TaskState
from .blame import abort_out_of_step, last_words, out_of_step, workers
from .findings import Finding, Found, HostSilent, root_cause
from .generation import Generation
from .lockstep import foresee
from .tailcut import TailCut


class Limits(Protocol):  # what of the restart policy the watches read
    start_timeout_s: float
    heartbeat_timeout_s: float
    hang_timeout_s: float


class Watch:
    def __init__(self, policy: Limits, links: dict[str, AgentLink],
                 clock: Callable[[], float],
                 tell: Callable[[ev.Event], None] = lambda event: None) -> None:
        # A finished job's end, cut when a task sits idle (job/detect/tailcut.py).
        self._tail = TailCut(getattr(policy, "finished_idle_s", 0.0), clock,
                             getattr(policy, "exit_handlers_s", 60.0))
        self._policy = policy
        self._tell = tell
        self._links = links
        self._clock = clock

    def silence(self, gen: Generation) -> Iterator[Finding]:
        """Hosts whose agent stopped talking, tasks that stopped making progress,
        and a job that did not get going: each finding yielded is acted on
        before the next look (what the generation is then decides it)."""
        now = self._clock()
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None and now - link.last_seen > self._policy.heartbeat_timeout_s:
                yield HostSilent(host, say(Kind.HOST_LOST, "silent_agent",
                                           {"silent_s": now - link.last_seen}))
        if (found := self.out_of_step(gen, now)) is not None:
            yield found
        if gen.settled():
            return
        cut = self._tail.check(gen)
        if cut is not None:  # a finished job's tail: the supervisor tells it and tears down
            yield cut
            return
        if (found := self.start(gen, now)) is not None:
            yield found
        for record in gen.records.values():
            if record.state is not TaskState.RUNNING or record.task.lifetime != "job":
                continue
            if record.cluster == "joining":
                continue  # waiting for its peers: restart.start_timeout_s decides
            silent = now - (record.last_activity or now)
            if silent > self._policy.hang_timeout_s:
                found = None if gen.positions.judged else out_of_step(gen, weak=True)
                if found is not None:  # stuck because a worker is elsewhere: say where
                    gen.positions.judged = True
                    yield Found(found[0], Kind.OUT_OF_STEP, "silent", {
                        "cause": found[1].reason, "silent_s": silent,
                        "limit_s": self._policy.hang_timeout_s})
                    continue
                yield Found(record, Kind.HANG, "silent",
                            {"silent_s": silent, "limit_s": self._policy.hang_timeout_s})

    def position(self, gen: Generation, record: TaskRecord, data: dict[str, Any]) -> Found | None:
        """A progress report: the task's position kept; a failure already
        found may get its real cause from it (reports trail an abort)."""
        gen.positions.take(record.task.name, data, self._clock())
        if gen.failure is not None:
            return self.out_of_step(gen, self._clock())
        if not gen.positions.warned and "at_len" in data:
            ahead = foresee(workers(gen))
            if ahead is not None:
                gen.positions.warned = True
                culprit = gen.records[ahead.task]
                self._tell(ev.OutOfStepAhead(generation=gen.plan.generation, task=ahead.task,
                                             host=culprit.task.host, reason=ahead.reason))
        return None

    def out_of_step(self, gen: Generation, now: float) -> Found | None:
        """Every worker alive and the job quiet, but their positions disagree
        for good: the worker out of step is the failure, long before
        `hang_timeout_s`. A collective abort whose positions arrived after it
        gets its real cause here too."""
        positions = gen.positions
        if positions.judged:
            return None
        if gen.failure is not None:
            better = abort_out_of_step(gen)
            if better is not None:
                gen.failure = better
                self._tell(root_cause(better))
            return None
        records = [r for r in gen.records.values()
                   if r.task.role in ("chief", "worker") and r.task.lifetime == "job"]
        if gen.phase is not Phase.TRAINING or positions.quiet_s(now) < positions.quiet_needed() \
                or any(r.state not in (TaskState.RUNNING, TaskState.SUCCEEDED) for r in records):
            return None
        found = out_of_step(gen)
        if found is None:
            return None
        positions.judged = True
        record, finding = found
        return Found(record, Kind.OUT_OF_STEP, "quiet",
                     {"cause": finding.reason, "quiet_s": positions.quiet_s(now)})

    def stopped(self, gen: Generation, record: TaskRecord, status: Any, t: Any) -> Found | None:
        """A task frozen (SIGSTOP) past `stalls.STOPPED_HANG_S` is hung; a shorter
        freeze (a VM pause, a starved host) passes."""
        span = gen.stopped.hung(f"{record.task.host}/{record.task.name}", status, t)
        if (span is None or gen.settled()
                or record.state is not TaskState.RUNNING or record.task.lifetime != "job"):
            return None
        return Found(record, Kind.HANG, "frozen", {"span_s": span, "limit_s": gen.stopped.limit_s})

    def start(self, gen: Generation, now: float) -> Found | None:
        """`restart.start_timeout_s`: every task started, and a cluster that
        some task began to form (MultiWorkerMirroredStrategy's setup) formed,
        within it. The failure names every task missing and its last words."""
        limit = self._policy.start_timeout_s
        records = list(gen.records.values())
        # Per task: a ParameterServerStrategy worker may be started again late.
        missing = [r for r in records if r.state is TaskState.STARTING
                   and now - (r.started_at or now) > limit]
        how = "not_started"
        # From the first task's joining: data loading before the strategy is no hang.
        forming = gen.forming_since is not None and now - gen.forming_since > limit
        if not missing and forming and not gen.finishing():
            missing = [r for r in records if r.cluster != "joined" and not r.state.terminal
                       and r.task.role in ("chief", "worker") and r.task.lifetime == "job"]
            # Those that never began to join first: the others wait for them.
            missing.sort(key=lambda r: r.cluster == "joining")
            how = "not_joined"
        if not missing:
            return None
        named = "; ".join(say(Kind.START_TIMEOUT, "each", {"task": r.task.label,
                                                            "last": last_words(r)})
                          for r in missing)
        return Found(missing[0], Kind.START_TIMEOUT, how,
                     {"count": len(missing), "limit_s": limit, "named": named},
                     last_lines=tuple(missing[0].tail))
