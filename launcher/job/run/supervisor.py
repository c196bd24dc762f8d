"""The supervisor: the job across generations. It runs one; when it failed,
decides whether and how to restart (the budget, progress, the hosts of the
next one, the backoff), and runs the next.

What happens inside a generation (starting its tasks, every agent message,
the detectors, the teardown) is its runner's (job/run/runner.py), on the same
thread. Outcomes are values (`RunResult`); exceptions are for the launcher's
own faults. Signals only set a flag (`request_stop`), read by the runner's loop.

It decides and tells; it formats no text for people. Every fact is one typed
event (launcher/job/record/events.py), told through its `Teller` (job/run/teller.py):
written to the run directory and told to its `Voice` (the operator's printer,
which words it: launcher/views/narrate.py) and to any other `Listener`. A task's
state moves by the events that concern it (`Teller.happen`: `states.apply`,
the state machine the run's model folds too; its start sent is `task_starting`);
the generation's phase by `Generation.enter` (launcher/job/record/phases.py), which
tells the job's (`job_phase`).

Must not import: cli, ops. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...spec.config import DEFAULT_MAX_SKIPS, RestartPolicy  # the cluster file's `restart:`
from ...spec.plan import Plan
from ...spec.rundir import RunRecorder
from ...transport import AgentLink, AgentMessage
from ..detect import checkpoints, resumes
from ..detect.blame import repeated_failure
from ..detect.generation import Generation
from ..detect.sentinel import BatchSkip, Sentinel
from ..lines.output import Voice
from ..policy import batchskips, keras_fallback, savedirs
from ..policy.hostwait import HostWaiter
from ..policy.recovery import Budget, HostInfo, NotEnoughHosts, decide_restart
from ..policy.restarts import End, JobSoFar, count_restart, keras_switched, skip_batch
from ..record import events as ev
from ..record.classify import script_mistake
from ..record.failkinds import free_first, traits
from ..record.phases import Phase
from ..record.states import JobStatus, RunResult, final_state
from ..record.story import Beside
from .runner import GenerationRunner
from .teller import Teller


class Supervisor:
    def __init__(
        self,
        make_plan: Callable[[int, Sequence[str]], Plan],
        hosts: Sequence[HostInfo],
        links: dict[str, AgentLink],
        events: queue.Queue[AgentMessage],
        recorder: RunRecorder,
        voice: Voice,
        policy: RestartPolicy,
        reconnect: Callable[[str], AgentLink] | None = None,
        checkpoint_probe: Callable[[], checkpoints.State | None] = lambda: None,
        launcher_info: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        listeners: Sequence[ev.Listener] = (),
        max_skips: int = DEFAULT_MAX_SKIPS,
    ) -> None:
        self._make_plan = make_plan
        self._hosts = list(hosts)
        self._links = links
        self._recorder = recorder
        self._story = story = Teller(recorder, voice, listeners)
        self._policy = policy
        self._checkpoint_probe = checkpoint_probe
        self._clock = clock
        self._keras_switch: dict[str, Any] | None = None  # keras_fallback: once per job
        self._resumes = resumes.Resumes()  # where each restarted generation resumed
        self._sentinel = Sentinel(story.tell, max_skips)  # a loss or a save gone non-finite
        self._runner = runner = GenerationRunner(
            links, events, recorder, voice, story, policy, self._resumes, self._sentinel,
            spares=tuple(h.name for h in hosts if h.spare), checkpoint_probe=checkpoint_probe,
            launcher_info=dict(launcher_info or {}), clock=clock, wall_clock=wall_clock)
        self.profiler = runner.profiler  # synchronized traces (`mgpu-launch profile`)
        self._waiter = HostWaiter(reconnect, links, story.tell, runner.wait, runner.stop_pending,
                                  clock, hosts=self._hosts, policy=policy)

    @property
    def links(self) -> dict[str, AgentLink]:
        """The agent links in use now (a reconnected host has a new one)."""
        return self._links

    @property
    def current(self) -> Generation | None:
        """The generation running now (None before the first); read-only for observers."""
        return self._runner.current

    @property
    def phase(self) -> Phase | None:
        """The current generation's phase (None before the first)."""
        return self.current.phase if self.current is not None else None

    def request_stop(self, signum: int) -> None:
        """Safe from a signal handler: only records the request."""
        self._runner.request_stop(signum)

    def snapshot(self) -> list[Beside]:
        """What the supervisor alone knows of every task of the current generation
        (the live table shows it beside the run's model)."""
        return self._runner.snapshot()

    # -------------------------------------------------------------------- run

    def run(self) -> RunResult:
        started = self._clock()
        policy = self._policy
        job = JobSoFar(Budget(policy.max_restarts, policy.max_total_restarts),
                   [h.name for h in self._hosts if not h.spare])
        while True:
            end = self._one_generation(job)
            if end is not None:
                break
        message = end.message
        status = end.status
        failures = job.failures
        result = RunResult(
            status=status,
            restarts=job.restarts,
            wall_s=self._clock() - started,
            # The failure that ended the job; earlier generations' are in `failures`.
            root_cause=failures[-1] if failures and status == JobStatus.FAILED else None,
            tasks=job.tasks,
            interrupted_by=self._runner.stop_signal if status == JobStatus.INTERRUPTED else None,
            failures=tuple(failures),
            message=message,
            stopped_by=end.stopped_by if status == JobStatus.FAILED else "",
            keras_switched=self._keras_switch,
            resumed=tuple(self._resumes.entries),
            stragglers=tuple(self._runner.radar.named),
        )
        self._story.tell(ev.JobDone(status=result.status, restarts=job.restarts,
                              wall_s=round(result.wall_s, 3), stopped_by=result.stopped_by,
                              message=message, interrupted_by=result.interrupted_by))
        return result

    def _one_generation(self, job: JobSoFar) -> End | None:
        """Run generation `job.generation`; its end, or None to run the next one."""
        plan = self._make_plan(job.generation, job.active)
        if self._keras_switch is not None:
            plan = keras_fallback.under_tf_keras(plan)
        plan = batchskips.with_skips(plan, job.skipped)  # the bad batches skipped so far
        plan = savedirs.with_save_dirs(plan, self._resumes.save_dirs)  # where it may mend
        self._runner.place_copies(plan)
        checkpoint_before = self._checkpoint_probe()
        self._resumes.starting(job.generation, checkpoint_before)
        gen = self._runner.run(plan)
        job.tasks = {r.task.label: {**final_state(r, job.generation),
                                    "start": self._runner.starts.get(r.task.name)}
                     for r in gen.records.values()}
        if gen.interrupted:
            return End(JobStatus.INTERRUPTED)
        if gen.failure is None:
            return End(JobStatus.SUCCEEDED)
        job.failures.append(gen.failure)
        if gen.resumed_past and job.last_counted:  # the restart before it did move the training
            job.budget = job.budget.refund()
        # Progress is the training moving: a save past the best before it
        # (job/detect/resumes.py); where its step is unknown, a checkpoint the runtime
        # reported saving, or a checkpoint series that moved on disk (not file times).
        advanced = self._resumes.moved_past()
        if advanced is None:
            advanced = gen.advanced or checkpoints.advanced(checkpoint_before,
                                                            self._checkpoint_probe())
        # Free: the first failure of a kind that is not the script's bug (a port
        # taken); the sentinel's: free, or skip or again (the same step twice).
        judged = {"free": free_first([f.kind for f in job.failures]),
                  **self._sentinel.judged(job.failures, job.skipped)}
        decision = decide_restart(job.budget, advanced,
                                  preempted=traits(gen.failure.kind).preempted,
                                  repeated=repeated_failure(job.failures),
                                  mistake=script_mistake(gen.failure.error), **judged)
        if not decision.restart:
            return End(JobStatus.FAILED, decision.message, decision.stopped_by)
        job.budget = decision.budget
        try:
            active = self._waiter.hosts_for_next(gen, job.active)
        except NotEnoughHosts as exc:
            return End(JobStatus.FAILED, str(exc), "min_workers")
        if active is None:
            if self._runner.stop_signal:
                return End(JobStatus.INTERRUPTED)
            return End(JobStatus.FAILED, "a lost host did not come back in time", "host_wait")
        job.active = active
        return self._restart(job, gen, advanced, decision.counts, judged.get("skip"),
                             free=bool(judged.get("free")))

    def _restart(self, job: JobSoFar, gen: Generation, advanced: bool, counts: bool,
                 skip: BatchSkip | None = None, free: bool = False) -> End | None:
        """Tell the restart (and the bad batch it skips) and wait its backoff; an
        end when a stop came meanwhile."""
        assert gen.failure is not None
        if skip is not None:
            self._story.tell(skip_batch(job, skip, self._sentinel.max_skips))
        if self._keras_switch is None and keras_fallback.should_switch(gen.plan, gen.failure,
                                                                       gen.stepped):
            self._keras_switch = keras_fallback.switched(job.generation + 1, gen.failure)
            self._story.tell(keras_switched(self._keras_switch))
        restart = count_restart(job, self._policy, counts=counts, advanced=advanced,
                                trained_s=self._clock() - gen.started_at,
                                preempted=traits(gen.failure.kind).preempted,
                                skipped=skip is not None,
                                free=gen.failure.kind if free and not counts else None)
        fence = round(max(0.0, gen.fence_until - self._clock() - restart.backoff_s), 1)
        if fence > 0:  # a lost host's tasks may still run: none of the next generation yet
            restart = replace(restart, fence_s=fence)
        gen.enter(Phase.BACKOFF)
        self._story.tell(restart)
        return End(JobStatus.INTERRUPTED) if self._runner.wait(restart.backoff_s + fence) else None

