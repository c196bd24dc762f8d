"""The end of a generation: stopping its tasks (after a failure, at a stop the
user asked for, or the servers once training is done), taking a stuck job's
Python stacks first, and giving up on exits no agent confirms.

Called from the supervisor thread only; tells `StopRequested`,
`TeardownBegun`, `StacksRequested`, `Stacks` and `TaskUnconfirmed` events.
Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...spec.plan import Plan
from ...spec.rundir import RunRecorder
from ...transport import AgentLink
from ..detect.blame import innermost_frames
from ..detect.generation import Generation
from ..record import events as ev
from ..record.failkinds import traits
from ..record.phases import Phase
from ..record.states import Failure, TaskRecord, TaskState

# After the grace period's SIGKILL, how long to wait for agents to confirm
# every exit before giving up on a task (its host is then unreachable).
TEARDOWN_SLACK_S = 5.0
# Grace of a teardown after a crash or hang (the full `grace_s` is kept for a
# stop the user asked for and for preemption, where tasks save a checkpoint).
# The peers of a dead worker cannot save a consistent checkpoint: a long grace
# only delays the restart. (Measured before runtime/guards.py gave SIGTERM back
# to Python: TensorFlow's preemption notifier swallowed it in every MWMS worker
# and the whole grace was spent on every crash teardown; a script that catches
# SIGTERM itself may still use it all.)
CRASH_GRACE_S = 0.5
# Before the SIGTERM of a teardown after a failure that blames a peer (a
# collective abort, a lost peer): the peers' own exits and last position
# reports, which may name the real cause (job/detect/blame.py), come within
# moments; SIGTERM ends an MWMS task at once (runtime/guards.py) and would cut
# them off.
SETTLE_S = 0.5
# Before a hang teardown, how long to wait for the tasks' Python stacks (each
# agent gives its tasks ~1 s to dump them; a stopped task never answers).
STACKS_WAIT_S = 3.0


class Teardown:
    def __init__(self, links: dict[str, AgentLink], recorder: RunRecorder,
                 clock: Callable[[], float], tell: Callable[[ev.Event], None],
                 happen: Callable[[Generation, ev.Event], None]) -> None:
        self._links = links  # the supervisor's: a reconnected host's new link shows here
        self._recorder = recorder
        self._clock = clock
        self._tell = tell  # tell an event
        self._happen = happen  # tell an event and move the tasks it concerns

    def on_stop_request(self, gen: Generation, signal: int | None) -> None:
        """A stop asked for: every task is stopped with the full grace (their
        checkpoint saved); a second one kills them now."""
        hurry = gen.interrupted
        if not hurry:
            gen.stop_signal = signal
            self._tell(ev.StopRequested(generation=gen.plan.generation, signal=signal,
                                        grace_s=gen.plan.grace_s))
        already = gen.tearing_down
        gen.enter(Phase.STOPPING)
        if hurry or not already:
            self.stop_tasks(gen, "stop", 0.0 if hurry else gen.plan.grace_s)

    def after_failure(self, gen: Generation) -> None:
        """Stop every task of a failed generation (its stacks were taken)."""
        assert gen.failure is not None
        gen.enter(Phase.TEARING_DOWN)
        settle = SETTLE_S if gen.failure.secondary else 0.0
        self.stop_tasks(gen, "failure", failure_grace(gen.failure, gen.plan), settle)

    def stop_tasks(self, gen: Generation, why: str, grace: float, settle: float = 0.0) -> None:
        """Tell every agent of the generation to stop its tasks within `grace`,
        SIGTERM `settle` seconds from now."""
        self._happen(gen, ev.TeardownBegun(generation=gen.plan.generation, why=why,
                                           grace_s=grace, settle_s=settle))
        # Every host of the job, whatever we believe of its tasks: stopping is
        # idempotent, and a task we think is over may still be running.
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None:
                link.send({"op": "stop", "tasks": None, "grace_s": grace, "settle_s": settle})
        gen.teardown_deadline = self._clock() + settle + grace + TEARDOWN_SLACK_S

    def collecting_stacks(self, gen: Generation) -> bool:
        """True while a stuck job's Python stacks are on their way: asked for
        once, before the teardown, and waited for at most STACKS_WAIT_S."""
        if gen.failure is None or not traits(gen.failure.kind).stuck:  # something is stuck
            return False
        now = self._clock()
        if gen.phase is Phase.FAILING:
            gen.enter(Phase.TAKING_STACKS)
            gen.stacks_deadline = now + STACKS_WAIT_S
            by_host: dict[str, list[str]] = {}
            for record in gen.records.values():
                if record.state in (TaskState.STARTING, TaskState.RUNNING) \
                        and record.task.host not in gen.lost_hosts:
                    by_host.setdefault(record.task.host, []).append(record.task.name)
            for host, names in by_host.items():
                link = self._links.get(host)
                if link is not None and link.send({"op": "stacks", "tasks": names}):
                    gen.stacks_pending.update(names)
            if gen.stacks_pending:
                self._tell(ev.StacksRequested(generation=gen.plan.generation,
                                              tasks=tuple(sorted(gen.stacks_pending))))
        return bool(gen.stacks_pending) and now < gen.stacks_deadline

    def on_stacks(self, gen: Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        gen.stacks_pending.discard(record.task.name)
        text = body["text"]
        path = self._recorder.write_stacks(
            record.task.name, record.task.label, gen.plan.generation,
            text or f"(no stacks: {body['error'] or 'the task wrote none'})")
        record.stack = text
        failure = gen.failure
        frames = innermost_frames(text) if text else ()
        blamed = failure is not None and failure.task == record.task.label and bool(frames)
        self._tell(ev.Stacks(generation=gen.plan.generation, task=record.task.name,
                             host=record.task.host, file=str(path), taken=bool(text),
                             frames=tuple(frames) if blamed else None))
        if failure is not None and blamed:
            gen.failure = replace(failure, stack=frames)

    def give_up_on_stragglers(self, gen: Generation) -> None:
        """Tasks whose exit no agent confirmed: their hosts count as lost, so the
        next generation gets a fresh agent there (or goes on without them)."""
        for record in gen.records.values():
            if not record.state.terminal:
                self._happen(gen, ev.TaskUnconfirmed(generation=gen.plan.generation,
                                                     task=record.task.name,
                                                     host=record.task.host))
                if record.task.host not in gen.lost_hosts:
                    gen.lost_hosts.add(record.task.host)
                    link = self._links.get(record.task.host)
                    if link is not None:
                        link.close()


def failure_grace(failure: Failure, plan: Plan) -> float:
    """A preempted task's peers are saving their checkpoint too: full grace."""
    if traits(failure.kind).preempted:
        return plan.grace_s
    return min(plan.grace_s, CRASH_GRACE_S)
