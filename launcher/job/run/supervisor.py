"""The supervisor: one loop that starts, watches, tears down and restarts a job.

Owns all run-time state. Agents' reader threads push `AgentMessage`s into one
queue; only the supervisor thread mutates state. Outcomes are values
(`RunResult`); exceptions are for the launcher's own faults. Signals only set
a flag (`request_stop`), read by the loop.

It decides and tells; it formats no text for people. Every fact is one typed
event (launcher/job/record/events.py), told through its `Teller` (job/run/teller.py):
written to the run directory and told to its `Voice` (the operator's printer,
which words it: launcher/views/narrate.py) and to any other `Listener`. A task's
state moves by the events that concern it (`Teller.happen`: `states.apply`,
the state machine the run's model folds too; its start sent is `task_starting`);
the generation's phase by `Generation.enter` (launcher/job/record/phases.py), which
tells the job's (`job_phase`).

A failure is acted on when it is first seen — a task's exit, a fatal
TensorFlow error in its output, a silent task, a silent host — because TF
peers of a dead or hung worker take many seconds to exit by themselves. The
detectors return what they find (job/detect/findings.py); the loop acts on it (`_act`).

Must not import: cli, ops. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from ...spec.config import RestartPolicy  # the cluster file's `restart:`, its defaults
from ...spec.plan import Plan, Task
from ...spec.rundir import RunRecorder
from ...strategy import ON_JAX, Strategy
from ...transport import AgentLink, AgentMessage
from ..detect import checkpoints, resumes
from ..detect.blame import repeated_failure
from ..detect.findings import Failures, Finding, Found, HostSilent, restarted_alone
from ..detect.generation import Generation
from ..detect.radar import Radar
from ..detect.sentinel import Sentinel
from ..detect.tailcut import grace_s as tail_grace
from ..detect.watch import Watch
from ..lines.output import TaskOutput, Voice
from ..policy import keras_fallback
from ..policy.fence import tasks_over_by
from ..policy.hostwait import HostWaiter
from ..policy.recovery import Budget, HostInfo, NotEnoughHosts, decide_restart
from ..policy.restarts import End, JobSoFar, count_restart, keras_switched
from ..policy.teardown import Teardown
from ..record import events as ev
from ..record.classify import OutputWatcher, exit_of, script_mistake
from ..record.failkinds import Kind, traits
from ..record.phases import Phase
from ..record.states import (
    IllegalTransition,
    JobStatus,
    RunResult,
    TaskRecord,
    TaskState,
    final_state,
)
from ..record.story import Beside
from . import fwreport
from .intake import Intake
from .peerrelay import PeerRelay
from .profiling import Profiler
from .protocol import BadMessage, check_message
from .teller import Teller

POLL_S = 0.1
MAX_BATCH = 500  # messages handled per loop turn before the checks run again
# At a generation's end, for what is still queued (transport/inbox.py): at most
# 20,000 lines, seconds even on a busy host; a second Ctrl-C cuts it short.
DRAIN_S = 10.0
# A ParameterServerStrategy worker that keeps dying is a real failure.
MAX_SINGLE_WORKER_RESTARTS = 5
# Messages refused as malformed that are recorded one by one; the rest are counted.
MAX_BAD_MESSAGES_RECORDED = 20


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
    ) -> None:
        self._make_plan = make_plan
        self._hosts = list(hosts)
        self._links = links
        self._events = events
        self._recorder = recorder
        self._voice = voice
        self._story = story = Teller(recorder, voice, listeners)
        self._output = TaskOutput(voice, recorder, clock, story.tell)
        self._failures = Failures(story.tell, wall_clock)
        self._policy = policy
        self._checkpoint_probe = checkpoint_probe
        self._launcher_info = dict(launcher_info or {})
        self._clock = clock
        self._wall = wall_clock
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._handled_stops = 0
        self._bad_messages = 0
        self._starts: dict[str, str] = {}  # task -> "warm" / "cold", this generation
        self._keras_switch: dict[str, Any] | None = None  # keras_fallback: once per job
        self._resumes = resumes.Resumes()  # where each restarted generation resumed
        self._sentinel = Sentinel(story.tell)  # a loss or a save gone non-finite
        self._teardown = Teardown(links, recorder, clock, story.tell, story.happen)
        # The memory tier's copies on other hosts, relayed and placed (job/run/peerrelay.py).
        self._peers = PeerRelay(lambda: self._links, story.tell, clock)
        self._opened: dict[str, set[int]] = {}  # ports each host's tasks opened (fwreport)
        self._watch = Watch(policy, links, clock, story.tell)
        self._waiter = HostWaiter(reconnect, links, story.tell, self._wait, self._stop_pending,
                                  clock, hosts=self._hosts, policy=policy)
        self.current: Generation | None = None  # read-only for observers (live view)
        # Synchronized traces of the running tasks (job/run/profiling.py).
        self.profiler = Profiler(getattr(recorder, "run_dir", None), clock, wall_clock)
        self._radar = Radar(story.tell, clock, policy.on_straggler,
                            spares=tuple(h.name for h in hosts if h.spare), probe=checkpoint_probe,
                            profiler=self.profiler,  # stragglers named (and replaced)
                            alive=lambda h: not getattr(self._links.get(h), "closed", True))
        # Every progress report, heard by the detectors that read progress (job/run/intake.py).
        self._intake = Intake(clock, story.tell, self._act, self._watch, self._sentinel,
                              self._resumes, self._radar)

    @property
    def links(self) -> dict[str, AgentLink]:
        """The agent links in use now (a reconnected host has a new one)."""
        return self._links

    @property
    def phase(self) -> Phase | None:
        """The current generation's phase (None before the first)."""
        return self.current.phase if self.current is not None else None

    # ----------------------------------------------------------------- control

    def request_stop(self, signum: int) -> None:
        """Safe from a signal handler: only records the request."""
        self._stop_signal = signum
        self._stop_count += 1

    def _stop_pending(self) -> bool:
        return self._stop_count > self._handled_stops

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
            interrupted_by=self._stop_signal if status == JobStatus.INTERRUPTED else None,
            failures=tuple(failures),
            message=message,
            stopped_by=end.stopped_by if status == JobStatus.FAILED else "",
            keras_switched=self._keras_switch,
            resumed=tuple(self._resumes.entries),
            stragglers=tuple(self._radar.named),
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
        self._place_copies(plan)
        checkpoint_before = self._checkpoint_probe()
        self._resumes.starting(job.generation, checkpoint_before)
        gen = self._run_generation(plan)
        job.tasks = {r.task.label: {**final_state(r, job.generation),
                                    "start": self._starts.get(r.task.name)}
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
        decision = decide_restart(job.budget, advanced,
                                  preempted=traits(gen.failure.kind).preempted,
                                  repeated=repeated_failure(job.failures),
                                  mistake=script_mistake(gen.failure.error),
                                  **self._sentinel.judged(job.failures))  # free, again
        if not decision.restart:
            return End(JobStatus.FAILED, decision.message, decision.stopped_by)
        job.budget = decision.budget
        try:
            active = self._waiter.hosts_for_next(gen, job.active)
        except NotEnoughHosts as exc:
            return End(JobStatus.FAILED, str(exc), "min_workers")
        if active is None:
            if self._stop_signal:
                return End(JobStatus.INTERRUPTED)
            return End(JobStatus.FAILED, "a lost host did not come back in time", "host_wait")
        job.active = active
        return self._restart(job, gen, advanced, decision.counts)

    def _restart(self, job: JobSoFar, gen: Generation, advanced: bool, counts: bool) -> End | None:
        """Tell the restart and wait its backoff; an end when a stop came meanwhile."""
        assert gen.failure is not None
        if self._keras_switch is None and keras_fallback.should_switch(gen.plan, gen.failure,
                                                                       gen.stepped):
            self._keras_switch = keras_fallback.switched(job.generation + 1, gen.failure)
            self._story.tell(keras_switched(self._keras_switch))
        restart = count_restart(job, self._policy, counts=counts, advanced=advanced,
                                trained_s=self._clock() - gen.started_at,
                                preempted=traits(gen.failure.kind).preempted)
        fence = round(max(0.0, gen.fence_until - self._clock() - restart.backoff_s), 1)
        if fence > 0:  # a lost host's tasks may still run: none of the next generation yet
            restart = replace(restart, fence_s=fence)
        gen.enter(Phase.BACKOFF)
        self._story.tell(restart)
        return End(JobStatus.INTERRUPTED) if self._wait(restart.backoff_s + fence) else None

    def _place_copies(self, plan: Plan) -> None:
        """The memory tier: before a restart, the newest save each host of the
        plan needs, in its memory (job/run/peerrelay.py)."""
        keep = next((t.env.get("MGPU_MEMORY_COPIES") for t in plan.tasks), None)
        if not keep:
            return
        hosts = [t.host for t in plan.tasks]
        self._peers.use_plan(hosts, int(keep))
        if plan.generation > 0:
            self._peers.prepare(hosts, lambda: self._wait(POLL_S))

    def _wait(self, seconds: float) -> bool:
        """Sleep while draining events; True when a stop was requested meanwhile."""
        deadline = self._clock() + seconds
        while self._clock() < deadline:
            if self._stop_pending():
                return True
            self._peers.tick()  # an offer waiting for a worker's save, during a backoff too
            message = self._next_message(min(POLL_S, max(0.0, deadline - self._clock())))
            if message is not None and message.event == "output":
                self._output.line(None, message)
            elif message is not None and message.event in ("hello", "log"):  # a host came back,
                self._handle(None, message)  # its agent's word: no generation's (agent_log)
        return self._stop_pending()

    def _next_message(self, timeout: float) -> AgentMessage | None:
        """The next message from an agent, checked (`protocol`); None when none
        came within `timeout`. A malformed one is logged and skipped."""
        deadline = self._clock() + timeout
        while True:
            try:
                raw = self._events.get(timeout=max(0.0, deadline - self._clock()))
            except queue.Empty:
                return None
            try:
                message = AgentMessage(raw.host, check_message(raw.message), raw.link_id)
            except BadMessage as exc:
                self._refuse(raw, str(exc))
            else:
                if message.event == "ports_opened":  # sealed there: and on the other hosts
                    self._seal_ports(message)
                elif not self._peers.consumed(message):  # the memory tier's copies
                    return message
            if self._clock() >= deadline:
                return None

    def _seal_ports(self, message: AgentMessage | None, to: str | None = None) -> None:
        """Ports a host's tasks opened (sealed there): to the other hosts' agents;
        or (no message: a new agent's hello) every host's so far, to host `to`."""
        if message is not None:
            self._opened.setdefault(message.host, set()).update(message.message["ports"])
        sources = {message.host: message.message["ports"]} if message else self._opened
        for opened, ports in list(sources.items()) if self.current is not None else []:
            command = fwreport.seal_ports(self.current.plan, opened, sorted(ports))
            for host, link in list(self._links.items()):
                if command is not None and host != opened and to in (None, host):
                    link.send(command)

    def _refuse(self, raw: AgentMessage, why: str) -> None:
        self._bad_messages += 1
        if self._bad_messages <= MAX_BAD_MESSAGES_RECORDED:
            self._story.tell(ev.BadMessage(host=raw.host, reason=why))

    # -------------------------------------------------------------- generation

    def _run_generation(self, plan: Plan) -> Generation:
        jax = plan.strategy in ON_JAX
        gen = Generation(plan, {t.name: TaskRecord(t, watcher=OutputWatcher(jax=jax))
                                for t in plan.tasks}, started_at=self._clock(),
                         tell=self._story.tell)
        self.current = gen
        self._starts = {}
        first = self._launcher_info if plan.generation == 0 else {}  # what ran, on what
        self._story.tell(ev.Launch(
            generation=plan.generation, launcher_pid=self._launcher_info.get("launcher_pid"),
            launcher_host=self._launcher_info.get("launcher_host"),
            tasks=tuple(ev.Placed(task=t.name, host=t.host, address=t.address, port=t.port,
                                  address_rule=t.address_rule, lifetime=t.lifetime)
                        for t in plan.tasks),
            command=first.get("command"), hosts=first.get("hosts")))
        gen.tell_phase()  # starting
        for task in plan.tasks:
            if task.host not in gen.lost_hosts:  # a dead link found by an earlier start
                self._start(gen, task)
        next_watch = self._clock()
        while True:
            self._turn(gen)
            if self._clock() >= next_watch:
                next_watch = self._clock() + 0.5
                for found in self._watch.silence(gen):
                    self._act(gen, found)
                self._story.write_due()  # progress held back, now due
                self.profiler.poll(gen, self._links)  # traces asked by `mgpu-launch profile`
                self._radar.tick(gen, self._links)  # and the straggler radar's, rarely
                self._peers.tick()  # the memory tier's offers waiting for a worker's save
                self._voice.refresh(self.snapshot())
            if self._decide(gen):
                break
        self._drain(gen)
        if gen.phase.stopping:
            self._story.tell(ev.TeardownDone(generation=plan.generation))
        gen.enter(Phase.ENDED)
        return gen

    def _turn(self, gen: Generation) -> None:
        """Take a stop request, then a batch of messages."""
        if self._stop_pending():
            self._handled_stops = self._stop_count
            self._teardown.on_stop_request(gen, self._stop_signal)
        message = self._next_message(POLL_S)
        # Drain a burst in one go: a flood of output lines must not delay
        # the exit report queued behind it by a loop turn per line.
        for handled in range(1, MAX_BATCH + 1):
            if message is None:
                break
            self._handle_safely(gen, message)
            # ...but act on a failure at once, before more lines are read
            # (and take no message the batch would not handle: it would be lost).
            message = None if gen.settled() or handled == MAX_BATCH else self._next_message(0)

    def _decide(self, gen: Generation) -> bool:
        """What the phase calls for now; True when the generation is over."""
        if gen.phase.stopping:
            if gen.all_terminal():
                return True
            if self._clock() > gen.teardown_deadline:
                self._teardown.give_up_on_stragglers(gen)
                return True
        elif gen.phase in (Phase.FAILING, Phase.TAKING_STACKS):
            if self._teardown.collecting_stacks(gen):
                return False  # a hung job: its stacks first, then the teardown
            self._teardown.after_failure(gen)
        elif gen.jobs_done():
            if not gen.services_left():
                return True
            # Servers (ps, PS-strategy workers) never exit by themselves.
            gen.enter(Phase.TEARING_DOWN)
            self._teardown.stop_tasks(gen, "finished", gen.plan.grace_s)
        return False

    def _drain(self, gen: Generation) -> None:
        """Handle what is still queued as a generation ends (in a flood, output
        that an exit went ahead of: the logs get a task's last lines), for at
        most DRAIN_S."""
        deadline = self._clock() + DRAIN_S
        while self._clock() < deadline and not self._stop_pending():
            message = self._next_message(0)
            if message is None:
                return
            self._handle_safely(gen, message)

    def _start(self, gen: Generation, task: Task) -> None:
        record = gen.records[task.name]
        self._story.happen(gen, ev.TaskStarting(generation=gen.plan.generation, task=task.name,
                                                host=task.host))
        record.started_at = record.last_activity = self._clock()
        link = self._links.get(task.host)
        sent = link is not None and link.send({
            "op": "start",
            "task": task.name,
            "generation": gen.plan.generation,
            "argv": list(task.argv),
            "cwd": task.cwd,
            "env": dict(task.env),
            "tf_config": task.tf_config_json(),
            "standby": self._policy.warm_standby,
            # The host's firewall rules for the job's ports (launcher.firewall).
            "firewall": seal.to_json() if (seal := gen.plan.firewall.get(task.host)) else None,
        })
        if not sent:
            self._host_lost(gen, task.host, "agent connection is closed")

    # --------------------------------------------------------------- messages

    def _handle_safely(self, gen: Generation, message: AgentMessage) -> None:
        """A message the checks let through may still not fit the current state
        (a late exit, a task started twice): it is logged, never fatal."""
        try:
            self._handle(gen, message)
        except IllegalTransition as exc:
            self._refuse(message, f"{message.event}: illegal transition {exc}")
        except Exception as exc:  # noqa: BLE001 - one message must not end a job of days
            self._refuse(message, f"{message.event}: {type(exc).__name__}: {exc}")

    def _handle(self, gen: Generation | None, message: AgentMessage) -> None:
        body = message.message
        event = message.event
        link = self._links.get(message.host)
        if link is not None and message.link_id and message.link_id != link.link_id:
            # A late message of a host's previous connection (it reconnected
            # since): its output may still be shown, nothing else is acted on.
            if event == "output":
                self._act(gen, self._output.line(gen, message))
            return
        if event == "agent_lost":
            if message.host in {t.host for t in gen.plan.tasks}:
                self._host_lost(gen, message.host, str(body.get("detail") or "connection closed"))
        elif event == "log":  # the agent's own diagnostics
            self._story.tell(ev.AgentLog(host=message.host, text=str(body.get("text", "")),
                                   notice=bool(body.get("notice"))))
        elif event == "hello":
            self._on_hello(message.host, body)
        elif event == "output":
            self._act(gen, self._output.line(gen, message))
        elif event == "heartbeat":
            for task_name, usage in body["tasks"].items():
                record = gen.records.get(task_name)
                if record is not None and record.task.host == message.host:
                    record.usage = usage
                    self._act(gen, self._watch.stopped(gen, record, usage.get("status"),
                                                       body.get("t")))
                    self._act(gen, self._radar.heartbeat(gen, record, usage, body.get("t")))
        else:
            self._handle_task(gen, message)

    def _handle_task(self, gen: Generation, message: AgentMessage) -> None:
        """A message about one task of this generation."""
        body, event = message.message, message.event
        name = body.get("task")
        record = gen.records.get(name) if name else None
        if event in ("profile", "profile_part"):
            self.profiler.on_message(message.host, body)
            return
        if event == "stacks" and record is not None and body.get("generation") is None:
            gen.stacks_pending.discard(name)  # the agent has no such task running
            return
        if record is None or body.get("generation") != gen.plan.generation:
            return  # a late message about a previous generation, or no task of ours
        if record.task.host != message.host:
            raise ValueError(f"{message.host} speaks for {record.task.label}")
        if event == "started":
            record.pid = body["pid"]
            start = body.get("start") or "cold"
            self._starts[name] = start
            self._story.happen(gen, ev.TaskStarted(
                generation=gen.plan.generation, task=name, host=record.task.host,
                pid=record.pid, start=start, start_reason=body.get("start_reason") or ""))
        elif event == "start_failed":
            error = str(body.get("error", ""))
            self._story.happen(gen, ev.StartFailed(generation=gen.plan.generation, task=name,
                                             host=record.task.host, error=error))
            self._failures.fail(gen, Found(record, Kind.START_FAILED, "agent", {"error": error},
                                           t=body.get("t")))
        elif event == "exited":
            self._on_exit(gen, record, body)
        elif event == "progress":
            self._intake.hear(gen, record, body["data"])
        elif event == "stacks":
            self._teardown.on_stacks(gen, record, body)

    def _on_hello(self, host: str, hello: dict[str, Any]) -> None:
        """A new agent reaped what an earlier one of this job left on its host
        (tasks that outlived a lost connection): say so, it explains a gap.
        It learns the ports the other hosts' tasks opened."""
        self._seal_ports(None, to=host)
        reaped = hello.get("reaped")
        if not isinstance(reaped, list) or not reaped:
            return
        tasks = sorted({str(r.get("task")) for r in reaped if isinstance(r, dict)})
        self._story.tell(ev.Reaped(host=host, tasks=tuple(tasks), count=len(reaped)))

    # -------------------------------------------------------- exits, failures

    def _on_exit(self, gen: Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        self._output.flush(record)
        record.exit_code = body.get("code")
        record.signal = body.get("signal")
        stopping = bool(body.get("stopping"))
        stopped = gen.tearing_down or record.state is TaskState.STOPPING
        self._story.happen(gen, ev.TaskExited(
            generation=gen.plan.generation, task=record.task.name, host=record.task.host,
            exit_code=record.exit_code, signal=record.signal, stopped_by_launcher=stopping))
        tail = tuple(body.get("tail") or ())
        kind, how, facts = exit_of(body)
        found = Found(record, kind, how, facts, last_lines=tail, t=body.get("t"),
                      error=body.get("error"))
        if stopped:
            if record.state is TaskState.STOPPED and not stopping and record.exit_code != 0:
                # It died by itself, maybe before what started the teardown (its
                # exit report waits for its output to drain): it may be the cause.
                self._failures.consider(gen, self._failures.of(gen, found))
            return
        if record.state is TaskState.SUCCEEDED:  # a job task done, or a service that may end
            return
        if self._worker_restarts_alone(gen, record):
            self._story.happen(gen, restarted_alone(self._failures.of(gen, found)))
            self._start(gen, record.task)
            return
        self._failures.fail(gen, found)

    def _worker_restarts_alone(self, gen: Generation, record: TaskRecord) -> bool:
        """Under ParameterServerStrategy a worker's death does not fail the job:
        the coordinator reschedules its closures; the worker is started again
        on the same address so the cluster regains its capacity."""
        if gen.plan.strategy != Strategy.PARAMETER_SERVER or record.task.role != "worker":
            return False
        gen.single_restarts[record.task.name] = gen.single_restarts.get(record.task.name, 0) + 1
        return gen.single_restarts[record.task.name] <= MAX_SINGLE_WORKER_RESTARTS

    def _host_lost(self, gen: Generation, host: str, detail: str, silent: bool = False) -> None:
        if host in gen.lost_hosts:
            return
        gen.lost_hosts.add(host)
        now = self._clock()
        gen.fence_until = max(gen.fence_until, tasks_over_by(
            lost_at=now, last_seen=getattr(self._links.get(host), "last_seen", now),
            lease_s=self._policy.heartbeat_timeout_s, silent=silent))
        victims = [r for r in gen.on_host(host) if not r.state.terminal]
        tearing_down = gen.tearing_down
        self._story.happen(gen, ev.HostLost(generation=gen.plan.generation, host=host,
                                      detail=detail))
        link = self._links.get(host)
        if link is not None:
            link.close()  # if the agent is merely stuck, EOF makes it kill its tasks
        for record in victims:
            found = Found(record, Kind.HOST_LOST, "lost", {"detail": detail})
            if not tearing_down:
                self._failures.fail(gen, found)
            elif gen.failure is not None:  # a primary cause, if what we have is a symptom
                self._failures.consider(gen, self._failures.of(gen, found))

    def _act(self, gen: Generation, found: Finding | None) -> None:
        """What a detector found: a host lost, a finished job's tail cut, or a
        task's failure (a collective abort's culprit is then looked for)."""
        if isinstance(found, HostSilent):
            self._host_lost(gen, found.host, found.detail, silent=True)
        elif isinstance(found, ev.TailCut):
            self._story.tell(found)
            gen.enter(Phase.TEARING_DOWN)
            self._teardown.stop_tasks(gen, "done", tail_grace(found, gen.plan))  # its line says it
        elif found is not None:
            self._failures.fail(gen, found)
            if traits(found.kind).blames_a_peer:
                self._output.blame(gen, found.record)

    def snapshot(self) -> list[Beside]:
        """What the supervisor alone knows of every task of the current generation
        (the live table shows it beside the run's model)."""
        gen = self.current
        return [] if gen is None else gen.beside(self._clock())
