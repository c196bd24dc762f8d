"""The phase of a generation, one enum; `PHASES` lists its legal moves.

    STARTING      -> FORMING        a task began to join the cluster (MWMS setup)
    STARTING/FORMING -> TRAINING    a task reported progress
    STARTING/FORMING/TRAINING -> FAILING   a failure is known (the root cause may still change)
    FAILING       -> TAKING_STACKS  a stuck job (hang, start timeout): its Python stacks first
    FAILING/TAKING_STACKS -> TEARING_DOWN  every task is being stopped (short grace)
    STARTING/FORMING/TRAINING -> TEARING_DOWN  training done: the servers are stopped
    any running phase -> STOPPING   a stop was asked for (Ctrl-C, SIGTERM, `mgpu-launch stop`);
                                    again on a second Ctrl-C (no grace)
    STARTING/FORMING/TRAINING/TEARING_DOWN/STOPPING -> ENDED  every task is gone
    FAILING       -> ENDED          a failure found in the messages drained at the end
    ENDED         -> WAITING_FOR_HOST  between generations: a lost host is waited for
    ENDED/WAITING_FOR_HOST -> BACKOFF  between generations: the restart's delay

The job's phase as the views say it (story.JOB_STATES, the `job_phase` event)
is a function of its generation's (`job_phase`): starting, then running once
every task started, failing, stopping, waiting_for_host, restarting.

The data that goes with a phase (the failure, the teardown's deadline, the
stacks' deadline) lives on the generation; the phase alone says what the loop
does next. Pure values; no I/O.
"""

from __future__ import annotations

import enum


class Phase(enum.Enum):
    STARTING = "starting"
    FORMING = "forming"
    TRAINING = "training"
    FAILING = "failing"
    TAKING_STACKS = "taking_stacks"
    TEARING_DOWN = "tearing_down"
    STOPPING = "stopping"
    ENDED = "ended"
    WAITING_FOR_HOST = "waiting_for_host"
    BACKOFF = "backoff"

    @property
    def running(self) -> bool:
        """Tasks run and nothing has gone wrong (yet)."""
        return self in RUNNING

    @property
    def stopping(self) -> bool:
        """Every task has been told to stop."""
        return self in (Phase.TEARING_DOWN, Phase.STOPPING)


RUNNING = frozenset({Phase.STARTING, Phase.FORMING, Phase.TRAINING})

PHASES: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.FORMING, Phase.TRAINING, Phase.FAILING,
                               Phase.TEARING_DOWN, Phase.STOPPING, Phase.ENDED}),
    Phase.FORMING: frozenset({Phase.TRAINING, Phase.FAILING, Phase.TEARING_DOWN,
                              Phase.STOPPING, Phase.ENDED}),
    Phase.TRAINING: frozenset({Phase.FAILING, Phase.TEARING_DOWN, Phase.STOPPING,
                               Phase.ENDED}),
    # (ENDED: a failure found in the last messages drained after the tasks ended)
    Phase.FAILING: frozenset({Phase.TAKING_STACKS, Phase.TEARING_DOWN, Phase.STOPPING,
                              Phase.ENDED}),
    Phase.TAKING_STACKS: frozenset({Phase.TEARING_DOWN, Phase.STOPPING}),
    Phase.TEARING_DOWN: frozenset({Phase.STOPPING, Phase.ENDED}),
    Phase.STOPPING: frozenset({Phase.STOPPING, Phase.ENDED}),
    Phase.ENDED: frozenset({Phase.WAITING_FOR_HOST, Phase.BACKOFF}),
    Phase.WAITING_FOR_HOST: frozenset({Phase.WAITING_FOR_HOST, Phase.BACKOFF}),
    Phase.BACKOFF: frozenset(),
}


class IllegalPhase(Exception):
    """A move `PHASES` does not allow: a bug of the supervisor."""


def move(now: Phase, to: Phase) -> Phase:
    """`to`, when `PHASES` allows it; raises IllegalPhase otherwise."""
    if to not in PHASES[now]:
        raise IllegalPhase(f"{now.value} -> {to.value}")
    return to


# The job's phase (the `job_phase` event) in the phases that are not the
# running ones; TEARING_DOWN (after a failure, or training done) and ENDED
# move it nowhere.
_JOB_PHASE = {Phase.FAILING: "failing", Phase.TAKING_STACKS: "failing",
              Phase.STOPPING: "stopping", Phase.WAITING_FOR_HOST: "waiting_for_host",
              Phase.BACKOFF: "restarting"}


def job_phase(phase: Phase, started: bool) -> str | None:
    """The job's phase in `phase` (`started`: every task of the generation
    started once), or None where it does not move."""
    if phase.running:
        return "running" if started else "starting"
    return _JOB_PHASE.get(phase)
