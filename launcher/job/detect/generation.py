"""One generation of a job: its plan, its tasks' records, its phase and the
data that goes with the phase (the failure, the teardown's and the stacks'
deadlines).

Owned by the supervisor thread. The phase moves only through `enter`
(launcher/job/record/phases.py lists the moves), and the job's phase is told
(`job_phase`) as it moves; the root cause only through `consider`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ...spec.plan import Plan
from ..record import events as ev
from ..record.phases import Phase, job_phase, move
from ..record.states import Failure, TaskRecord, TaskState
from ..record.story import Beside
from .lockstep import Positions
from .stalls import StoppedWatch


@dataclass
class Generation:
    plan: Plan
    records: dict[str, TaskRecord]
    phase: Phase = Phase.STARTING
    failure: Failure | None = None  # the root cause so far (FAILING and after)
    teardown_deadline: float = 0.0  # TEARING_DOWN, STOPPING: when to give up on exits
    stacks_deadline: float = 0.0  # TAKING_STACKS: until when to wait for the stacks
    stop_signal: int | None = None  # the signal of the stop asked for (STOPPING)
    advanced: bool = False  # the runtime reported a checkpoint saved in this generation
    resumed_past: bool = False  # it resumed past the previous generation's resume point
    stepped: bool = False  # a task reported a training step
    lost_hosts: set[str] = field(default_factory=set)
    # Until when a lost host's tasks may still run (job/policy/fence.py): the
    # next generation starts no sooner.
    fence_until: float = 0.0
    # Hosts the next generation goes on without, though their agents answer
    # (a straggler's, restart.on_straggler: replace): a spare takes their place.
    set_aside: set[str] = field(default_factory=set)
    single_restarts: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0  # monotonic
    forming_since: float | None = None  # the first `joining` of the generation (monotonic)
    stacks_pending: set[str] = field(default_factory=set)
    stopped: StoppedWatch = field(default_factory=StoppedWatch)  # frozen tasks (SIGSTOP)
    positions: Positions = field(default_factory=Positions)  # where each task is (lockstep)
    tell: Callable[[ev.Event], None] = lambda event: None  # the story's teller (job_phase)
    told_phase: str = ""  # the job's phase as last told
    # Tasks not seen started yet, the next to look at last (`started`).
    unstarted: list[TaskRecord] | None = field(default=None, repr=False)

    def enter(self, phase: Phase) -> None:
        """The only way the phase changes; raises phases.IllegalPhase otherwise."""
        self.phase = move(self.phase, phase)
        self.tell_phase()

    def tell_phase(self) -> None:
        """Tell the job's phase (`job_phase`) when it moved: after the phase, or
        once every task runs (the one place the job's phase is worked out)."""
        now = job_phase(self.phase, self.phase.running and self.started())
        if now is not None and now != self.told_phase:
            self.told_phase = now
            self.tell(ev.JobPhase(generation=self.plan.generation, phase=now))

    def started(self) -> bool:
        """Every task was seen started (running, or done already) once: in O(1)
        a call, amortized, as each start's answer asks it."""
        if self.unstarted is None:
            self.unstarted = list(self.records.values())[::-1]
        while self.unstarted and self.unstarted[-1].state in (TaskState.RUNNING,
                                                              TaskState.SUCCEEDED):
            self.unstarted.pop()
        return not self.unstarted

    @property
    def tearing_down(self) -> bool:
        return self.phase.stopping

    @property
    def interrupted(self) -> bool:
        """A stop was asked for (the generation ends interrupted)."""
        return self.stop_signal is not None or self.phase is Phase.STOPPING

    def settled(self) -> bool:
        """Something decided the generation's end: a failure or a teardown."""
        return not self.phase.running or self.failure is not None

    def consider(self, failure: Failure) -> bool:
        """The earliest primary failure is the root cause, not the peers that
        failed because of it (their symptoms may even be reported first).
        True when `failure` replaced an earlier root cause."""
        current = self.failure
        if current is None or (
            (failure.secondary, failure.t) < (current.secondary, current.t)
            and failure.task != current.task
        ):
            self.failure = failure
            if self.phase.running:
                self.enter(Phase.FAILING)
            return current is not None
        return False

    def all_terminal(self) -> bool:
        return all(r.state.terminal for r in self.records.values())

    def jobs_done(self) -> bool:
        """Every task that must finish by itself has exited 0."""
        return all(r.state is TaskState.SUCCEEDED
                   for r in self.records.values() if r.task.lifetime == "job")

    def finishing(self) -> bool:
        """A task finished training and exited 0: the others are winding down.
        TF's coordination service then reports the departed peer as
        "unhealthy" from the survivors; that is no failure."""
        return any(r.state is TaskState.SUCCEEDED for r in self.records.values())

    def services_left(self) -> bool:
        return any(not r.state.terminal
                   for r in self.records.values() if r.task.lifetime == "service")

    def record_of(self, role: str, index: int) -> TaskRecord | None:
        if role == "process":  # JAX names a process by its KERAS_DISTRIBUTION_PROCESS_ID
            return next((r for r in self.records.values()
                         if r.task.env.get("KERAS_DISTRIBUTION_PROCESS_ID") == str(index)), None)
        return self.records.get(f"{role}{index}")

    def on_host(self, host: str) -> list[TaskRecord]:
        return [r for r in self.records.values() if r.task.host == host]

    def beside(self, now: float) -> list[Beside]:
        """What the supervisor alone knows of each task (monotonic `now`), for the
        live table beside the run's model (story.Story.rows)."""
        return [Beside(label=r.task.label, generation=self.plan.generation,
                       cpu_percent=r.usage.get("cpu"), rss_mb=r.usage.get("rss_mb"),
                       silent_s=None if r.last_activity is None else now - r.last_activity)
                for r in self.records.values()]
