"""The supervisor: one loop that starts, watches, tears down and restarts a job.

Owns all run-time state. Agents' reader threads push `AgentMessage`s into one
queue; only the supervisor thread mutates state. Outcomes are values
(`RunResult`); exceptions are for the launcher's own faults. Signals only set
a flag (`request_stop`), read by the loop.

It decides and tells; it formats no text for people. Every fact is one typed
event (launcher/job/events.py), written to the run directory and told to its
`Voice` (the operator's printer, which words it: launcher/ops/narrate.py) and
to any other `Listener`. A task's state moves by the events that concern it
(`states.apply`, the state machine `status` replays too); the generation's
phase by `Generation.enter` (launcher/job/phases.py).

A failure is acted on when it is first seen — a task's exit, a fatal
TensorFlow error in its output, a silent task, a silent host — because TF
peers of a dead or hung worker take many seconds to exit by themselves.

Must not import: cli, ops. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import os
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..spec.plan import Plan, Task, task_label
from ..spec.rundir import RunRecorder, log_file_name
from ..strategy import COLLECTIVE, ON_JAX, Strategy
from ..transport import AgentLink, AgentMessage
from . import checkpoints, keras_fallback, resumes
from . import events as ev
from .blame import culprit, innermost_frames, last_words, repeated_failure
from .classify import RESTART_ME_EXIT, OutputWatcher, classify_exit, script_mistake
from .generation import Generation
from .hostwait import HostWaiter
from .noise import NoiseFolder
from .phases import Phase
from .protocol import BadMessage, check_message
from .recovery import (
    BACKOFF_RESET_S,
    Budget,
    HostInfo,
    NotEnoughHosts,
    backoff_delay,
    choose_hosts,
    decide_restart,
)
from .states import (
    Failure,
    IllegalTransition,
    RunResult,
    TaskRecord,
    TaskRow,
    TaskState,
    apply,
    final_state,
)

POLL_S = 0.1
MAX_BATCH = 500  # messages handled per loop turn before the checks run again
# At a generation's end, for what is still queued (transport/inbox.py): at most
# 20,000 lines, seconds even on a busy host; a second Ctrl-C cuts it short.
DRAIN_S = 10.0
# After the grace period's SIGKILL, how long to wait for agents to confirm
# every exit before giving up on a task (its host is then unreachable).
TEARDOWN_SLACK_S = 5.0
# Grace of a teardown after a crash or hang (the full `grace_s` is kept for a
# stop the user asked for and for preemption, where tasks save a checkpoint).
# TensorFlow's coordination service catches SIGTERM in every MWMS worker (its
# preemption notifier) and the worker keeps running, and the peers of a dead
# worker cannot save a consistent checkpoint anyway: a long grace only delays
# the restart. Measured: the whole grace was spent on every crash teardown.
CRASH_GRACE_S = 0.5
# A ParameterServerStrategy worker that keeps dying is a real failure.
MAX_SINGLE_WORKER_RESTARTS = 5
# Before a hang teardown, how long to wait for the tasks' Python stacks (each
# agent gives its tasks ~1 s to dump them; a stopped task never answers).
STACKS_WAIT_S = 3.0
# Failures after which the tasks' stacks are worth taking: something is stuck.
STUCK_KINDS = ("hang", "start_timeout")
# Strategies whose workers all die with a peer: their output tells of it first.
WATCHED_STRATEGIES = COLLECTIVE
# Messages refused as malformed that are recorded one by one; the rest are counted.
MAX_BAD_MESSAGES_RECORDED = 20


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    max_total_restarts: int = 100
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    start_timeout_s: float = 600.0
    heartbeat_timeout_s: float = 10.0
    hang_timeout_s: float = 300.0
    on_host_loss: str = "wait"
    min_workers: int = 1
    host_wait_s: float = 300.0
    warm_standby: str = "off"  # "auto": agents keep a standby per task (launcher.standby)


class Voice(ev.Listener, Protocol):
    """Where the story goes for people (the operator's printer, launcher/ops/
    printer.py, is one): told every event, handed every task's output line and
    the live rows. The supervisor sits below the views and never imports them
    (tests/test_layering.py, floors)."""

    verbose: bool

    def task_line(self, label: str, text: str) -> None: ...
    def refresh(self, rows: Sequence[TaskRow]) -> None: ...


@dataclass
class _Job:
    """What runs across generations: the restart budget and what it saw."""

    budget: Budget
    active: list[str]
    generation: int = 0
    restarts: int = 0
    backoff_attempt: int = 0  # restarts since the backoff was last reset
    failures: list[Failure] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class _End:
    status: str
    message: str = ""
    stopped_by: str = ""


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
        self._listeners = list(listeners)  # other views of the story (metrics, ...)
        self._noise = NoiseFolder(enabled=not voice.verbose)  # TF start-up: one line a task
        self._policy = policy
        self._checkpoint_probe = checkpoint_probe
        self._launcher_info = dict(launcher_info or {})
        self._restarts = 0
        self._clock = clock
        self._wall = wall_clock
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._handled_stops = 0
        self._bad_messages = 0
        self._starts: dict[str, str] = {}  # task -> "warm" / "cold", this generation
        self._keras_switch: dict[str, Any] | None = None  # keras_fallback: once per job
        self._resumes = resumes.Resumes()  # where each restarted generation resumed
        self._waiter = HostWaiter(reconnect, links, self._tell, self._wait, self._stop_pending,
                                  clock, retry_s=max(1.0, policy.backoff_s))
        self.current: Generation | None = None  # read-only for observers (live view)

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

    # ------------------------------------------------------------------ story

    def _tell(self, event: ev.Event) -> None:
        """Write `event` to the run directory and tell it to every view."""
        ev.write(self._recorder, event)
        self._voice.tell(event)
        for listener in self._listeners:
            listener.tell(event)

    def _happen(self, gen: Generation, event: ev.Event) -> None:
        """Tell `event`, and move the tasks it concerns (`states.apply`)."""
        self._tell(event)
        if isinstance(event, ev.TaskEvent):
            record = gen.records.get(event.task)
            targets = [record] if record is not None else []
        else:
            targets = list(gen.records.values())
        for record in targets:
            record.move(apply(record.state, event, host=record.task.host,
                              lifetime=record.task.lifetime))

    # -------------------------------------------------------------------- run

    def run(self) -> RunResult:
        started = self._clock()
        policy = self._policy
        job = _Job(Budget(policy.max_restarts, policy.max_total_restarts),
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
            root_cause=failures[-1] if failures and status == "failed" else None,
            tasks=job.tasks,
            interrupted_by=self._stop_signal if status == "interrupted" else None,
            failures=tuple(failures),
            message=message,
            stopped_by=end.stopped_by if status == "failed" else "",
            keras_switched=self._keras_switch,
            resumed=tuple(self._resumes.entries),
        )
        self._tell(ev.JobDone(status=result.status, restarts=job.restarts,
                              wall_s=round(result.wall_s, 3), stopped_by=result.stopped_by,
                              message=message))
        return result

    def _one_generation(self, job: _Job) -> _End | None:
        """Run generation `job.generation`; its end, or None to run the next one."""
        plan = self._make_plan(job.generation, job.active)
        if self._keras_switch is not None:
            plan = keras_fallback.under_tf_keras(plan)
        checkpoint_before = self._checkpoint_probe()
        self._resumes.starting(job.generation, checkpoint_before)
        gen = self._run_generation(plan)
        job.tasks = {r.task.label: {**final_state(r, job.generation),
                                    "start": self._starts.get(r.task.name)}
                     for r in gen.records.values()}
        if gen.interrupted:
            return _End("interrupted")
        if gen.failure is None:
            return _End("succeeded")
        job.failures.append(gen.failure)
        # Progress is the training moving: a checkpoint the runtime reported
        # saving, or a checkpoint series that moved on disk (not file times).
        advanced = gen.advanced or checkpoints.advanced(checkpoint_before,
                                                        self._checkpoint_probe())
        decision = decide_restart(job.budget, advanced,
                                  preempted=gen.failure.kind == "preempted",
                                  repeated=repeated_failure(job.failures),
                                  mistake=script_mistake(gen.failure.error))
        if not decision.restart:
            return _End("failed", decision.message, decision.stopped_by)
        job.budget = decision.budget
        try:
            active = self._hosts_for_next(gen, job.active)
        except NotEnoughHosts as exc:
            return _End("failed", str(exc), "min_workers")
        if active is None:
            if self._stop_signal:
                return _End("interrupted")
            return _End("failed", "a lost host did not come back in time", "host_wait")
        job.active = active
        return self._restart(job, gen, advanced, decision.counts)

    def _restart(self, job: _Job, gen: Generation, advanced: bool, counts: bool) -> _End | None:
        """Tell the restart and wait its backoff; an end when a stop came meanwhile."""
        assert gen.failure is not None
        if self._keras_switch is None and keras_fallback.should_switch(gen.plan, gen.failure):
            self._keras_switch = keras_fallback.switched(job.generation + 1, gen.failure)
            switch = self._keras_switch
            self._tell(ev.KerasSwitched(generation=switch["generation"], from_=switch["from"],
                                        to=switch["to"], task=switch["task"],
                                        why=switch["why"]))
        job.restarts += 1
        self._restarts = job.restarts
        job.generation += 1
        # The backoff always applies, doubling; a generation that trained for
        # a while proves the failure was no loop and resets it.
        if advanced and self._clock() - gen.started_at >= BACKOFF_RESET_S:
            job.backoff_attempt = 0
        policy = self._policy
        delay = backoff_delay(job.backoff_attempt, policy.backoff_s, policy.backoff_max_s)
        job.backoff_attempt += 1
        gen.enter(Phase.BACKOFF)
        self._tell(ev.Restart(
            generation=job.generation, restarts=job.restarts, counted=counts,
            progress=advanced, hosts=tuple(job.active), backoff_s=delay,
            spent=job.budget.spent, max_restarts=policy.max_restarts, total=job.budget.total,
            max_total_restarts=policy.max_total_restarts,
            preempted=gen.failure.kind == "preempted"))
        return _End("interrupted") if self._wait(delay) else None

    def _hosts_for_next(self, gen: Generation, active: list[str]) -> list[str] | None:
        """Hosts of the next generation; None when waiting was cut short."""
        # Hosts whose link died after their generation ended count as lost too.
        lost = gen.lost_hosts | {name for name in active if not self._link_alive(name)}
        if not lost:
            return active
        choice = choose_hosts(self._hosts, active, lost,
                              self._policy.on_host_loss, self._policy.min_workers)
        self._tell(ev.HostsChosen(hosts=choice.active, lost=tuple(sorted(lost)),
                                  message=choice.message))
        # Lost hosts we wait for, and any chosen host whose agent went away.
        reconnect = [n for n in choice.active if n in lost or not self._link_alive(n)]
        for name in reconnect:
            gen.enter(Phase.WAITING_FOR_HOST)
            if not self._waiter.wait_for(name, self._policy.host_wait_s):
                return None
        return list(choice.active)

    def _link_alive(self, host: str) -> bool:
        link = self._links.get(host)
        return link is not None and not link.closed

    def _wait(self, seconds: float) -> bool:
        """Sleep while draining events; True when a stop was requested meanwhile."""
        deadline = self._clock() + seconds
        while self._clock() < deadline:
            if self._stop_pending():
                return True
            message = self._next_message(min(POLL_S, max(0.0, deadline - self._clock())))
            if message is not None and message.event == "output":
                self._print_output(None, message)
            elif message is not None and message.event == "hello":  # a host came back
                self._on_hello(message.host, message.message)
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
                return AgentMessage(raw.host, check_message(raw.message), raw.link_id)
            except BadMessage as exc:
                self._refuse(raw, str(exc))
            if self._clock() >= deadline:
                return None

    def _refuse(self, raw: AgentMessage, why: str) -> None:
        self._bad_messages += 1
        if self._bad_messages <= MAX_BAD_MESSAGES_RECORDED:
            self._tell(ev.BadMessage(host=raw.host, reason=why))

    # -------------------------------------------------------------- generation

    def _run_generation(self, plan: Plan) -> Generation:
        jax = plan.strategy in ON_JAX
        gen = Generation(plan, {t.name: TaskRecord(t, watcher=OutputWatcher(jax=jax))
                                for t in plan.tasks}, started_at=self._clock())
        self.current = gen
        self._starts = {}
        self._tell(ev.Launch(
            generation=plan.generation, launcher_pid=self._launcher_info.get("launcher_pid"),
            launcher_host=self._launcher_info.get("launcher_host"),
            tasks=tuple(ev.Placed(task=t.name, host=t.host, address=t.address, port=t.port,
                                  address_rule=t.address_rule, lifetime=t.lifetime)
                        for t in plan.tasks)))
        for task in plan.tasks:
            if task.host not in gen.lost_hosts:  # a dead link found by an earlier start
                self._start(gen, task)
        next_watch = self._clock()
        while True:
            self._turn(gen)
            if self._clock() >= next_watch:
                next_watch = self._clock() + 0.5
                self._watch_silence(gen)
                self._voice.refresh(self.snapshot())
            if self._decide(gen):
                break
        self._drain(gen)
        if gen.phase.stopping:
            self._tell(ev.TeardownDone(generation=plan.generation))
        gen.enter(Phase.ENDED)
        return gen

    def _turn(self, gen: Generation) -> None:
        """Take a stop request, then a batch of messages."""
        if self._stop_pending():
            self._handled_stops = self._stop_count
            self._on_stop_request(gen)
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
                self._give_up_on_stragglers(gen)
                return True
        elif gen.phase in (Phase.FAILING, Phase.TAKING_STACKS):
            assert gen.failure is not None
            if self._collecting_stacks(gen):
                return False  # a hung job: its stacks first, then the teardown
            gen.enter(Phase.TEARING_DOWN)
            self._stop_tasks(gen, "failure", self._failure_grace(gen.failure, gen.plan))
        elif gen.jobs_done():
            if not gen.services_left():
                return True
            # Servers (ps, PS-strategy workers) never exit by themselves.
            gen.enter(Phase.TEARING_DOWN)
            self._stop_tasks(gen, "finished", gen.plan.grace_s)
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
        record.move(TaskState.STARTING)  # start sent (not an event: its answer is)
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

    def _watch_silence(self, gen: Generation) -> None:
        """Hosts whose agent stopped talking, tasks that stopped making progress,
        and a job that did not get going: every wait has an end."""
        now = self._clock()
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None and now - link.last_seen > self._policy.heartbeat_timeout_s:
                self._host_lost(gen, host, f"no heartbeat from its agent for "
                                f"{now - link.last_seen:.0f} s")
        if gen.settled():
            return
        self._watch_start(gen, now)
        for record in gen.records.values():
            if record.state is not TaskState.RUNNING or record.task.lifetime != "job":
                continue
            if record.cluster == "joining":
                continue  # waiting for its peers: restart.start_timeout_s decides
            silent = now - (record.last_activity or now)
            if silent > self._policy.hang_timeout_s:
                self._fail(gen, record, kind="hang",
                           reason=f"made no progress for {silent:.0f} s (no output, no "
                           f"progress report; restart.hang_timeout_s="
                           f"{self._policy.hang_timeout_s:g})")

    def _watch_stopped(self, gen: Generation, record: TaskRecord, status: object,
                       t: object) -> None:
        """A task frozen (SIGSTOP) past `stalls.STOPPED_HANG_S` is hung; a shorter
        freeze (a VM pause, a starved host) passes."""
        span = gen.stopped.hung(f"{record.task.host}/{record.task.name}", status, t)
        if (span is None or gen.settled()
                or record.state is not TaskState.RUNNING or record.task.lifetime != "job"):
            return
        self._fail(gen, record, kind="hang",
                   reason=f"was stopped (SIGSTOP, Ctrl-Z or a debugger) for {span:.1f} s "
                   f"(a freeze over {gen.stopped.limit_s:g} s is a hang): its peers cannot "
                   "go on without it")

    def _watch_start(self, gen: Generation, now: float) -> None:
        """`restart.start_timeout_s`: every task started, and a cluster that
        some task began to form (MultiWorkerMirroredStrategy's setup) formed,
        within it. The failure names every task missing and its last words."""
        limit = self._policy.start_timeout_s
        records = list(gen.records.values())
        # Per task: a ParameterServerStrategy worker may be started again late.
        missing = [r for r in records if r.state is TaskState.STARTING
                   and now - (r.started_at or now) > limit]
        what = "not started (its agent never confirmed the start)"
        # From the first task's joining: data loading before the strategy is no hang.
        forming = gen.forming_since is not None and now - gen.forming_since > limit
        if not missing and forming and not gen.finishing():
            missing = [r for r in records if r.cluster != "joined" and not r.state.terminal
                       and r.task.role in ("chief", "worker") and r.task.lifetime == "job"]
            # Those that never began to join first: the others wait for them.
            missing.sort(key=lambda r: r.cluster == "joining")
            what = "not joined the cluster"
        if not missing:
            return
        named = "; ".join(f"{r.task.label} (last output: {last_words(r)})" for r in missing)
        self._fail(gen, missing[0], kind="start_timeout",
                   reason=f"{len(missing)} task(s) {what} within restart.start_timeout_s="
                   f"{limit:g}: {named}", last_lines=tuple(missing[0].tail))

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

    def _handle(self, gen: Generation, message: AgentMessage) -> None:
        body = message.message
        event = message.event
        link = self._links.get(message.host)
        if link is not None and message.link_id and message.link_id != link.link_id:
            # A late message of a host's previous connection (it reconnected
            # since): its output may still be shown, nothing else is acted on.
            if event == "output":
                self._print_output(gen, message)
            return
        if event == "agent_lost":
            if message.host in {t.host for t in gen.plan.tasks}:
                self._host_lost(gen, message.host, str(body.get("detail") or "connection closed"))
        elif event == "log":  # the agent's own diagnostics
            self._tell(ev.AgentLog(host=message.host, text=str(body.get("text", "")),
                                   notice=bool(body.get("notice"))))
        elif event == "hello":
            self._on_hello(message.host, body)
        elif event == "output":
            self._print_output(gen, message)
        elif event == "heartbeat":
            for task_name, usage in body["tasks"].items():
                record = gen.records.get(task_name)
                if record is not None and record.task.host == message.host:
                    record.usage = usage
                    self._watch_stopped(gen, record, usage.get("status"), body.get("t"))
        else:
            self._handle_task(gen, message)

    def _handle_task(self, gen: Generation, message: AgentMessage) -> None:
        """A message about one task of this generation."""
        body, event = message.message, message.event
        name = body.get("task")
        record = gen.records.get(name) if name else None
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
            self._happen(gen, ev.TaskStarted(
                generation=gen.plan.generation, task=name, host=record.task.host,
                pid=record.pid, start=start, start_reason=body.get("start_reason") or ""))
        elif event == "start_failed":
            error = str(body.get("error", ""))
            self._happen(gen, ev.StartFailed(generation=gen.plan.generation, task=name,
                                             host=record.task.host, error=error))
            self._fail(gen, record, kind="start_failed", t=body.get("t"),
                       reason=f"could not start: {error}")
        elif event == "exited":
            self._on_exit(gen, record, body)
        elif event == "progress":
            self._on_progress(gen, record, body["data"])
        elif event == "stacks":
            self._on_stacks(gen, record, body)

    def _on_hello(self, host: str, hello: dict[str, Any]) -> None:
        """A new agent reaped what an earlier one of this job left on its host
        (tasks that outlived a lost connection): say so, it explains a gap."""
        reaped = hello.get("reaped")
        if not isinstance(reaped, list) or not reaped:
            return
        tasks = sorted({str(r.get("task")) for r in reaped if isinstance(r, dict)})
        self._tell(ev.Reaped(host=host, tasks=tuple(tasks), count=len(reaped)))

    def _on_progress(self, gen: Generation, record: TaskRecord, data: dict[str, Any]) -> None:
        record.last_activity = self._clock()
        ids = {"generation": gen.plan.generation, "task": record.task.name,
               "host": record.task.host}
        if data.get("cluster") in ("joining", "joined"):
            record.cluster = data["cluster"]
            if gen.forming_since is None:
                gen.forming_since = self._clock()
            if gen.phase is Phase.STARTING:
                gen.enter(Phase.FORMING)
            self._tell(ev.Cluster(**ids, state=record.cluster))
            return
        if gen.phase in (Phase.STARTING, Phase.FORMING):
            gen.enter(Phase.TRAINING)
        record.last_progress = data
        resumed = self._resumes.on_progress(gen.plan.generation, data)
        if resumed is not None:
            self._tell(ev.Resumed(generation=resumed["generation"], epoch=resumed.get("epoch"),
                                  step=resumed.get("step"),
                                  checkpoint=resumed.get("checkpoint")))
        if isinstance(data.get("step"), int | float):
            record.step_marks = [*record.step_marks[-1:], (self._clock(), int(data["step"]))]
        if data.get("checkpoint"):  # the runtime saw a checkpoint saved: training moved
            gen.advanced = True
        self._tell(ev.Progress(**ids, metrics=dict(data)))

    def _log_path(self, host: str, name: str | None) -> str:
        """A task's log file as the user may type it (relative when under the cwd)."""
        path = os.path.join(self._recorder.logs_dir, log_file_name(host, name))
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative

    def _print_output(self, gen: Generation | None, message: AgentMessage) -> None:
        body = message.message
        name, text = body.get("task"), body.get("text", "")
        record = gen.records.get(name) if gen and name else None
        label = record.task.label if record else task_label(message.host, name)
        for shown in self._noise.show(label, text, self._log_path(message.host, name)):
            self._voice.task_line(label, shown)
        self._recorder.log_line(log_file_name(message.host, name), text)
        if record is None or gen is None or body.get("generation") != gen.plan.generation:
            return
        record.last_activity = self._clock()
        record.tail.append(text)
        if (gen.plan.strategy in WATCHED_STRATEGIES and not gen.tearing_down
                and not gen.finishing()):
            self._watch_output(gen, record, text)
        elif gen.failure is not None and gen.failure.kind == "collective_abort":
            record.watcher.feed(text)
            self._blame_culprit(gen, record)

    def _watch_output(self, gen: Generation, record: TaskRecord, text: str) -> None:
        """A collective abort in a task's output fails the group now, seconds
        before the task would exit by itself."""
        alarm = record.watcher.feed(text)
        if alarm is not None and gen.failure is None:
            self._fail(gen, record, kind="collective_abort",
                       reason=f"aborted its collective ops ({alarm.code}): a peer died or hung",
                       last_lines=(alarm.line,))
            self._blame_culprit(gen, record)

    def _blame_culprit(self, gen: Generation, reporter: TaskRecord) -> None:
        blamed = culprit(gen, reporter)
        if blamed is not None:
            gen.failure = blamed
            self._tell_root_cause(blamed)

    def _tell_root_cause(self, failure: Failure) -> None:
        host, _, name = failure.task.partition("/")
        self._tell(ev.RootCause(generation=failure.generation, task=name, host=failure.host,
                                failure=failure.kind, reason=failure.reason))

    # -------------------------------------------------------- exits, failures

    def _on_exit(self, gen: Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        for shown in self._noise.flush(record.task.label,
                                       self._log_path(record.task.host, record.task.name)):
            self._voice.task_line(record.task.label, shown)
        record.exit_code = body.get("code")
        record.signal = body.get("signal")
        stopping = bool(body.get("stopping"))
        stopped = gen.tearing_down or record.state is TaskState.STOPPING
        self._happen(gen, ev.TaskExited(
            generation=gen.plan.generation, task=record.task.name, host=record.task.host,
            exit_code=record.exit_code, signal=record.signal, stopped_by_launcher=stopping))
        tail = tuple(body.get("tail") or ())
        reason = classify_exit(record.exit_code, record.signal, body.get("error"), tail)
        details = {"kind": _exit_kind(record), "reason": reason, "t": body.get("t"),
                   "last_lines": tail, "error": body.get("error")}
        if stopped:
            if record.state is TaskState.STOPPED and not stopping and record.exit_code != 0:
                # It died by itself, maybe before what started the teardown (its
                # exit report waits for its output to drain): it may be the cause.
                self._consider(gen, self._failure(gen, record, **details))
            return
        if record.state is TaskState.SUCCEEDED:  # a job task done, or a service that may end
            return
        if self._worker_restarts_alone(gen, record):
            self._happen(gen, ev.TaskRestarted(
                generation=gen.plan.generation, task=record.task.name, host=record.task.host,
                exit_code=record.exit_code, signal=record.signal, reason=reason))
            self._start(gen, record.task)
            return
        self._fail(gen, record, **details)

    def _worker_restarts_alone(self, gen: Generation, record: TaskRecord) -> bool:
        """Under ParameterServerStrategy a worker's death does not fail the job:
        the coordinator reschedules its closures; the worker is started again
        on the same address so the cluster regains its capacity."""
        if gen.plan.strategy != Strategy.PARAMETER_SERVER or record.task.role != "worker":
            return False
        gen.single_restarts[record.task.name] = gen.single_restarts.get(record.task.name, 0) + 1
        return gen.single_restarts[record.task.name] <= MAX_SINGLE_WORKER_RESTARTS

    def _host_lost(self, gen: Generation, host: str, detail: str) -> None:
        if host in gen.lost_hosts:
            return
        gen.lost_hosts.add(host)
        victims = [r for r in gen.on_host(host) if not r.state.terminal]
        tearing_down = gen.tearing_down
        self._happen(gen, ev.HostLost(generation=gen.plan.generation, host=host,
                                      detail=detail))
        link = self._links.get(host)
        if link is not None:
            link.close()  # if the agent is merely stuck, EOF makes it kill its tasks
        for record in victims:
            if not tearing_down:
                self._fail(gen, record, kind="host_lost", reason=f"lost its host: {detail}")
            elif gen.failure is not None:  # a primary cause, if what we have is a symptom
                self._consider(gen, self._failure(gen, record, kind="host_lost",
                                                  reason=f"lost its host: {detail}"))

    def _failure(self, gen: Generation, record: TaskRecord, *, kind: str, reason: str,
                 t: float | None = None, last_lines: tuple[str, ...] = (),
                 error: dict[str, Any] | None = None) -> Failure:
        return Failure(
            task=record.task.label, host=record.task.host, generation=gen.plan.generation,
            t=t if t is not None else self._wall(), kind=kind, reason=reason,
            exit_code=record.exit_code, signal=record.signal, last_lines=last_lines,
            error=error,
        )

    def _fail(self, gen: Generation, record: TaskRecord, **details: Any) -> None:
        """A failure of `record`. Its state moved by the event that told of it
        (an exit, a start failure, its host lost); a hung or aborting task is
        still running: it stays so until the teardown confirms its exit."""
        failure = self._failure(gen, record, **details)
        if gen.failure is None:
            self._tell(ev.FailureDetected(
                generation=gen.plan.generation, task=record.task.name, host=record.task.host,
                failure=failure.kind, exit_code=record.exit_code, signal=record.signal,
                reason=failure.reason))
        self._consider(gen, failure)

    def _consider(self, gen: Generation, failure: Failure) -> None:
        if gen.consider(failure):  # a new root cause, after an earlier one
            self._tell_root_cause(failure)

    def snapshot(self) -> list[TaskRow]:
        """The live status of every task of the current generation."""
        gen = self.current
        if gen is None:
            return []
        now = self._clock()
        rows = []
        for record in gen.records.values():
            progress = record.last_progress
            rate = None
            if len(record.step_marks) == 2:
                (t0, s0), (t1, s1) = record.step_marks
                rate = (s1 - s0) / (t1 - t0) if t1 > t0 else None
            rows.append(TaskRow(
                label=record.task.label, host=record.task.host, task=record.task.name,
                state=record.state.value, generation=gen.plan.generation,
                restarts=self._restarts,
                step=_number(progress.get("step")), steps_per_s=rate,
                loss=_number(progress.get("loss")),
                cpu_percent=record.usage.get("cpu"), rss_mb=record.usage.get("rss_mb"),
                silent_s=None if record.last_activity is None else now - record.last_activity,
            ))
        return rows

    # -------------------------------------------------------------- teardown

    def _on_stop_request(self, gen: Generation) -> None:
        """A stop asked for: every task is stopped with the full grace (their
        checkpoint saved); a second one kills them now."""
        hurry = gen.interrupted
        if not hurry:
            gen.stop_signal = self._stop_signal
            self._tell(ev.StopRequested(generation=gen.plan.generation,
                                        signal=self._stop_signal, grace_s=gen.plan.grace_s))
        already = gen.tearing_down
        gen.enter(Phase.STOPPING)
        if hurry or not already:
            self._stop_tasks(gen, "stop", 0.0 if hurry else gen.plan.grace_s)

    def _stop_tasks(self, gen: Generation, why: str, grace: float) -> None:
        """Tell every agent of the generation to stop its tasks within `grace`."""
        self._happen(gen, ev.TeardownBegun(generation=gen.plan.generation, why=why,
                                           grace_s=grace))
        # Every host of the job, whatever we believe of its tasks: stopping is
        # idempotent, and a task we think is over may still be running.
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None:
                link.send({"op": "stop", "tasks": None, "grace_s": grace})
        gen.teardown_deadline = self._clock() + grace + TEARDOWN_SLACK_S

    def _collecting_stacks(self, gen: Generation) -> bool:
        """True while a stuck job's Python stacks are on their way: asked for
        once, before the teardown, and waited for at most STACKS_WAIT_S."""
        if gen.failure is None or gen.failure.kind not in STUCK_KINDS:
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

    def _on_stacks(self, gen: Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        gen.stacks_pending.discard(record.task.name)
        text = body["text"]
        path = self._recorder.write_stacks(
            record.task.name, record.task.label, gen.plan.generation,
            text or f"(no stacks: {body['error'] or 'the task wrote none'})")
        self._tell(ev.Stacks(generation=gen.plan.generation, task=record.task.name,
                             host=record.task.host, file=str(path), taken=bool(text)))
        record.stack = text
        failure = gen.failure
        frames = innermost_frames(text) if text else ()
        if failure is not None and failure.task == record.task.label and frames:
            gen.failure = replace(failure, stack=frames)

    @staticmethod
    def _failure_grace(failure: Failure, plan: Plan) -> float:
        """A preempted task's peers are saving their checkpoint too: full grace."""
        if failure.kind == "preempted":
            return plan.grace_s
        return min(plan.grace_s, CRASH_GRACE_S)

    def _give_up_on_stragglers(self, gen: Generation) -> None:
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


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _exit_kind(record: TaskRecord) -> str:
    if record.exit_code == RESTART_ME_EXIT:
        return "preempted"
    return "signal" if record.signal is not None else "exit"
