"""The supervisor: one loop that starts, watches, tears down and restarts a job.

Owns all run-time state. Agents' reader threads push `AgentMessage`s into one
queue; only the supervisor thread mutates state, writes the run directory and
prints. Outcomes are values (`RunResult`); exceptions are for the launcher's
own faults. Signals only set a flag (`request_stop`), read by the loop.

A failure is acted on when it is first seen — a task's exit, a fatal
TensorFlow error in its output, a silent task, a silent host — because TF
peers of a dead or hung worker take many seconds to exit by themselves.

Must not import: cli. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import os
import queue
import signal as signals
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..spec.config import RestartPolicy  # the cluster file's `restart:`, its defaults
from ..spec.plan import Plan, Task, task_label
from ..spec.rundir import RunRecorder, log_file_name
from ..strategy import COLLECTIVE, ON_JAX, Strategy
from ..strategy import framework as strategy_framework
from ..transport import AgentLink, AgentMessage
from . import checkpoints, keras_fallback, resumes
from .classify import RESTART_ME_EXIT, OutputWatcher, classify_exit, script_mistake
from .noise import NoiseFolder
from .protocol import BadMessage, check_message
from .recovery import (
    BACKOFF_RESET_S,
    Budget,
    HostInfo,
    NotEnoughHosts,
    backoff_delay,
    choose_hosts,
    decide_restart,
    innermost_frame,
)
from .stalls import StoppedWatch
from .states import (
    Failure,
    IllegalTransition,
    RunResult,
    TaskRecord,
    TaskRow,
    TaskState,
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


@dataclass
class _Generation:
    plan: Plan
    records: dict[str, TaskRecord]
    failure: Failure | None = None
    teardown_deadline: float | None = None
    interrupted: int | None = None
    advanced: bool = False  # the runtime reported a checkpoint saved in this generation
    lost_hosts: set[str] = field(default_factory=set)
    single_restarts: dict[str, int] = field(default_factory=dict)
    started_at: float = 0.0  # monotonic
    forming_since: float | None = None  # the first `joining` of the generation
    # Stacks asked for before a hang teardown: until when to wait for them.
    stacks_deadline: float | None = None
    stacks_pending: set[str] = field(default_factory=set)
    stopped: StoppedWatch = field(default_factory=StoppedWatch)  # frozen tasks (SIGSTOP)

    @property
    def tearing_down(self) -> bool:
        return self.teardown_deadline is not None

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


class Voice(Protocol):
    """Where the supervisor's words for people go (the operator's printer,
    launcher/ops/printer.py, is one): the supervisor sits below the views and
    never imports them (tests/test_layering.py, floors)."""

    verbose: bool

    def notice(self, text: str) -> None: ...
    def debug(self, text: str) -> None: ...
    def task_line(self, label: str, text: str) -> None: ...
    def refresh(self, rows: Sequence[TaskRow]) -> None: ...


class Supervisor:
    def __init__(
        self,
        make_plan: Callable[[int, Sequence[str]], Plan],
        hosts: Sequence[HostInfo],
        links: dict[str, AgentLink],
        events: queue.Queue[AgentMessage],
        recorder: RunRecorder,
        printer: Voice,
        policy: RestartPolicy,
        reconnect: Callable[[str], AgentLink] | None = None,
        checkpoint_probe: Callable[[], checkpoints.State | None] = lambda: None,
        launcher_info: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._make_plan = make_plan
        self._hosts = list(hosts)
        self._links = links
        self._events = events
        self._recorder = recorder
        self._printer = printer
        self._noise = NoiseFolder(enabled=not printer.verbose)  # TF start-up: one line a task
        self._policy = policy
        self._reconnect = reconnect
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
        self.current: _Generation | None = None  # read-only for observers (live view)

    @property
    def links(self) -> dict[str, AgentLink]:
        """The agent links in use now (a reconnected host has a new one)."""
        return self._links

    # ----------------------------------------------------------------- control

    def request_stop(self, signum: int) -> None:
        """Safe from a signal handler: only records the request."""
        self._stop_signal = signum
        self._stop_count += 1

    # -------------------------------------------------------------------- run

    def run(self) -> RunResult:
        started = self._clock()
        policy = self._policy
        restarts = 0
        budget = Budget(policy.max_restarts, policy.max_total_restarts)
        failures: list[Failure] = []
        active = [h.name for h in self._hosts if not h.spare]
        generation, message, stopped_by = 0, "", ""
        backoff_attempt = 0  # restarts since the backoff was last reset
        while True:
            plan = self._make_plan(generation, active)
            if self._keras_switch is not None:
                plan = keras_fallback.under_tf_keras(plan)
            checkpoint_before = self._checkpoint_probe()
            self._resumes.starting(generation, checkpoint_before)
            gen = self._run_generation(plan)
            tasks = {r.task.label: {**final_state(r, generation),
                                    "start": self._starts.get(r.task.name)}
                     for r in gen.records.values()}
            if gen.interrupted is not None:
                status = "interrupted"
                break
            if gen.failure is None:
                status = "succeeded"
                break
            failures.append(gen.failure)
            # Progress is the training moving: a checkpoint the runtime reported
            # saving, or a checkpoint series that moved on disk (not file times).
            advanced = gen.advanced or checkpoints.advanced(checkpoint_before,
                                                            self._checkpoint_probe())
            repeated = _repeated_failure(failures)
            decision = decide_restart(budget, advanced,
                                      preempted=gen.failure.kind == "preempted",
                                      repeated=repeated,
                                      mistake=script_mistake(gen.failure.error))
            if not decision.restart:
                status, message, stopped_by = "failed", decision.message, decision.stopped_by
                break
            budget, counts = decision.budget, decision.counts
            try:
                active = self._hosts_for_next(gen, active)
            except NotEnoughHosts as exc:
                status, message, stopped_by = "failed", str(exc), "min_workers"
                break
            if active is None:
                status = "interrupted" if self._stop_signal else "failed"
                message = "" if self._stop_signal else "a lost host did not come back in time"
                stopped_by = "" if self._stop_signal else "host_wait"
                break
            if self._keras_switch is None and keras_fallback.should_switch(plan, gen.failure):
                self._keras_switch = keras_fallback.switched(generation + 1, gen.failure)
                self._recorder.event("keras_switched", **self._keras_switch)
                self._printer.notice(keras_fallback.notice(self._keras_switch))
            restarts += 1
            self._restarts = restarts
            generation += 1
            why = "the checkpoint advanced: not counted" if not counts else \
                f"{budget.spent} of {policy.max_restarts} allowed without progress"
            if gen.failure.kind == "preempted" and not counts:
                why = "preempted: not counted"
            # The backoff always applies, doubling; a generation that trained for
            # a while proves the failure was no loop and resets it.
            if advanced and self._clock() - gen.started_at >= BACKOFF_RESET_S:
                backoff_attempt = 0
            delay = backoff_delay(backoff_attempt, policy.backoff_s, policy.backoff_max_s)
            backoff_attempt += 1
            self._recorder.event("restart", generation=generation, restarts=restarts,
                                 counted=counts, progress=advanced, hosts=list(active),
                                 backoff_s=delay)
            self._printer.notice(f"restarting as generation {generation} in "
                                 f"{delay:g} s ({why}; restart {budget.total} of at most "
                                 f"{policy.max_total_restarts}); workers resume "
                                 "from the last checkpoint")
            if self._wait(delay):
                status = "interrupted"
                break
        if message:
            self._printer.notice(message)
        result = RunResult(
            status=status,
            restarts=restarts,
            wall_s=self._clock() - started,
            # The failure that ended the job; earlier generations' are in `failures`.
            root_cause=failures[-1] if failures and status == "failed" else None,
            tasks=tasks,
            interrupted_by=self._stop_signal if status == "interrupted" else None,
            failures=tuple(failures),
            message=message,
            stopped_by=stopped_by if status == "failed" else "",
            keras_switched=self._keras_switch,
            resumed=tuple(self._resumes.entries),
        )
        self._recorder.event("job_done", status=result.status, restarts=restarts,
                             wall_s=round(result.wall_s, 3), stopped_by=result.stopped_by)
        return result

    def _hosts_for_next(self, gen: _Generation, active: list[str]) -> list[str] | None:
        """Hosts of the next generation; None when waiting was cut short."""
        # Hosts whose link died after their generation ended count as lost too.
        lost = gen.lost_hosts | {name for name in active if not self._link_alive(name)}
        if not lost:
            return active
        choice = choose_hosts(self._hosts, active, lost,
                              self._policy.on_host_loss, self._policy.min_workers)
        if choice.message:
            self._printer.notice(choice.message)
        # Lost hosts we wait for, and any chosen host whose agent went away.
        reconnect = [n for n in choice.active if n in lost or not self._link_alive(n)]
        for name in reconnect:
            if not self._wait_for_host(name, self._policy.host_wait_s):
                return None
        return list(choice.active)

    def _link_alive(self, host: str) -> bool:
        link = self._links.get(host)
        return link is not None and not link.closed

    def _wait_for_host(self, host: str, timeout: float) -> bool:
        """Reconnect to `host` until it answers; False on timeout or interruption."""
        if self._reconnect is None:
            return False
        deadline = self._clock() + timeout
        attempt = 0
        while self._clock() < deadline:
            attempt += 1
            outcome = self._attempt_reconnect(host)
            if outcome is None:
                return False  # a stop was requested during the attempt
            if isinstance(outcome, AgentLink):
                self._links[host] = outcome
                self._recorder.event("host_back", host=host, attempts=attempt)
                self._printer.notice(f"host {host} is back")
                return True
            if attempt == 1:
                self._printer.notice(f"waiting up to {timeout:g} s for host {host}: {outcome}")
            if self._wait(max(1.0, self._policy.backoff_s)):
                return False
        return False

    def _attempt_reconnect(self, host: str) -> AgentLink | Exception | None:
        """One reconnection attempt: the new link, why it failed, or None when a
        stop came first. It runs in a thread: an attempt on a cut-off host blocks
        for the whole connect timeout, and Ctrl-C must not wait for that."""
        assert self._reconnect is not None
        reconnect = self._reconnect
        outcome: list[AgentLink | Exception] = []
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome.append(reconnect(host))
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=attempt, name=f"reconnect-{host}", daemon=True).start()
        while not done.wait(POLL_S):
            if self._stop_count > self._handled_stops:
                threading.Thread(target=_close_late_link, args=(done, outcome),
                                 daemon=True).start()
                return None
        return outcome[0]

    def _wait(self, seconds: float) -> bool:
        """Sleep while draining events; True when a stop was requested meanwhile."""
        deadline = self._clock() + seconds
        while self._clock() < deadline:
            if self._stop_count > self._handled_stops:
                return True
            message = self._next_message(min(POLL_S, max(0.0, deadline - self._clock())))
            if message is not None and message.event == "output":
                self._print_output(None, message)
            elif message is not None and message.event == "hello":  # a host came back
                self._on_hello(message.host, message.message)
        return self._stop_count > self._handled_stops

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
            self._recorder.event("bad_message", host=raw.host, reason=why)
            self._printer.debug(f"agent {raw.host}: ignored a malformed message: {why}")

    # -------------------------------------------------------------- generation

    def _run_generation(self, plan: Plan) -> _Generation:
        jax = plan.strategy in ON_JAX
        gen = _Generation(plan, {t.name: TaskRecord(t, watcher=OutputWatcher(jax=jax))
                                 for t in plan.tasks}, started_at=self._clock())
        self.current = gen
        self._starts = {}
        self._recorder.event(
            "launch", generation=plan.generation, **self._launcher_info,
            tasks=[{"task": t.name, "host": t.host, "address": t.address, "port": t.port,
                    "address_rule": t.address_rule}
                   for t in plan.tasks],
        )
        for task in plan.tasks:
            if task.host not in gen.lost_hosts:  # a dead link found by an earlier start
                self._start(gen, task)
        next_watch = self._clock()
        while True:
            if self._stop_count > self._handled_stops:
                self._handled_stops = self._stop_count
                self._on_stop_request(gen, hurry=gen.interrupted is not None)
            message = self._next_message(POLL_S)
            # Drain a burst in one go: a flood of output lines must not delay
            # the exit report queued behind it by a loop turn per line.
            for handled in range(1, MAX_BATCH + 1):
                if message is None:
                    break
                self._handle_safely(gen, message)
                # ...but act on a failure at once, before more lines are read
                # (and take no message the batch would not handle: it would be lost).
                settled = gen.tearing_down or gen.failure is not None
                message = None if settled or handled == MAX_BATCH else self._next_message(0)
            if self._clock() >= next_watch:
                next_watch = self._clock() + 0.5
                self._watch_silence(gen)
                self._printer.refresh(self.snapshot())
            if gen.tearing_down:
                if gen.all_terminal():
                    break
                if self._clock() > gen.teardown_deadline:
                    self._give_up_on_stragglers(gen)
                    break
            elif gen.failure is not None:
                if self._collecting_stacks(gen):
                    continue  # a hung job: its stacks first, then the teardown
                self._begin_teardown(gen, grace_s=self._failure_grace(gen.failure, gen.plan))
            elif gen.jobs_done():
                if not gen.services_left():
                    self._drain(gen)
                    return gen
                # Servers (ps, PS-strategy workers) never exit by themselves.
                self._printer.notice("training finished; stopping the servers")
                self._begin_teardown(gen)
        self._drain(gen)
        self._recorder.event("teardown_done", generation=plan.generation)
        return gen

    def _drain(self, gen: _Generation) -> None:
        """Handle what is still queued as a generation ends (in a flood, output
        that an exit went ahead of: the logs get a task's last lines), for at
        most DRAIN_S."""
        deadline = self._clock() + DRAIN_S
        while self._clock() < deadline and self._stop_count <= self._handled_stops:
            message = self._next_message(0)
            if message is None:
                return
            self._handle_safely(gen, message)

    def _start(self, gen: _Generation, task: Task) -> None:
        record = gen.records[task.name]
        record.move(TaskState.STARTING)
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

    def _watch_silence(self, gen: _Generation) -> None:
        """Hosts whose agent stopped talking, tasks that stopped making progress,
        and a job that did not get going: every wait has an end."""
        now = self._clock()
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None and now - link.last_seen > self._policy.heartbeat_timeout_s:
                self._host_lost(gen, host, f"no heartbeat from its agent for "
                                f"{now - link.last_seen:.0f} s")
        if gen.tearing_down or gen.failure is not None:
            return
        self._watch_start(gen, now)
        for record in gen.records.values():
            if record.state is not TaskState.RUNNING or record.task.lifetime != "job":
                continue
            if record.cluster == "joining":
                continue  # waiting for its peers: restart.start_timeout_s decides
            silent = now - (record.last_activity or now)
            if silent > self._policy.hang_timeout_s:
                self._fail(gen, record, gone=False, kind="hang",
                           reason=f"made no progress for {silent:.0f} s (no output, no "
                           f"progress report; restart.hang_timeout_s="
                           f"{self._policy.hang_timeout_s:g})")

    def _watch_stopped(self, gen: _Generation, record: TaskRecord, status: object,
                       t: object) -> None:
        """A task frozen (SIGSTOP) past `stalls.STOPPED_HANG_S` is hung; a shorter
        freeze (a VM pause, a starved host) passes."""
        span = gen.stopped.hung(f"{record.task.host}/{record.task.name}", status, t)
        if (span is None or gen.tearing_down or gen.failure is not None
                or record.state is not TaskState.RUNNING or record.task.lifetime != "job"):
            return
        self._fail(gen, record, gone=False, kind="hang",
                   reason=f"was stopped (SIGSTOP, Ctrl-Z or a debugger) for {span:.1f} s "
                   f"(a freeze over {gen.stopped.limit_s:g} s is a hang): its peers cannot "
                   "go on without it")

    def _watch_start(self, gen: _Generation, now: float) -> None:
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
        named = "; ".join(f"{r.task.label} (last output: {_last_words(r)})" for r in missing)
        self._fail(gen, missing[0], gone=False, kind="start_timeout",
                   reason=f"{len(missing)} task(s) {what} within restart.start_timeout_s="
                   f"{limit:g}: {named}", last_lines=tuple(missing[0].tail))

    # --------------------------------------------------------------- messages

    def _handle_safely(self, gen: _Generation, message: AgentMessage) -> None:
        """A message the checks let through may still not fit the current state
        (a late exit, a task started twice): it is logged, never fatal."""
        try:
            self._handle(gen, message)
        except IllegalTransition as exc:
            self._refuse(message, f"{message.event}: illegal transition {exc}")
        except Exception as exc:  # noqa: BLE001 - one message must not end a job of days
            self._refuse(message, f"{message.event}: {type(exc).__name__}: {exc}")

    def _handle(self, gen: _Generation, message: AgentMessage) -> None:
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
            return
        if event == "log":  # the agent's own diagnostics
            if body.get("notice"):
                self._printer.notice(f"host {message.host}: {body.get('text', '')}")
            else:
                self._printer.debug(f"agent {message.host}: {body.get('text', '')}")
            return
        if event == "hello":
            self._on_hello(message.host, body)
            return
        if event == "output":
            self._print_output(gen, message)
            return
        if event == "heartbeat":
            for task_name, usage in body["tasks"].items():
                record = gen.records.get(task_name)
                if record is not None and record.task.host == message.host:
                    record.usage = usage
                    self._watch_stopped(gen, record, usage.get("status"), body.get("t"))
            return
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
            if record.state is TaskState.STARTING:
                record.move(TaskState.RUNNING)
            start = body.get("start") or "cold"
            self._starts[name] = start
            self._recorder.event("task_started", generation=gen.plan.generation,
                                 task=name, host=record.task.host, pid=record.pid,
                                 start=start, start_reason=body.get("start_reason") or "")
        elif event == "start_failed":
            self._fail(gen, record, kind="start_failed", t=body.get("t"),
                       reason=f"could not start: {body.get('error', '')}")
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
        self._recorder.event("reaped", host=host, tasks=tasks, count=len(reaped))
        self._printer.notice(f"host {host}: stopped {len(reaped)} leftover task(s) of an "
                             f"earlier agent of this job ({', '.join(tasks)})")

    def _on_progress(self, gen: _Generation, record: TaskRecord, data: dict[str, Any]) -> None:
        record.last_activity = self._clock()
        if data.get("cluster") in ("joining", "joined"):
            record.cluster = data["cluster"]
            if gen.forming_since is None:
                gen.forming_since = self._clock()
            self._recorder.event("cluster", generation=gen.plan.generation,
                                 task=record.task.name, host=record.task.host,
                                 state=record.cluster)
            return
        record.last_progress = data
        resumed = self._resumes.on_progress(gen.plan.generation, data)
        if resumed is not None:
            self._recorder.event("resumed", **resumed)
            self._printer.notice(resumes.notice(resumed))
        if isinstance(data.get("step"), int | float):
            record.step_marks = [*record.step_marks[-1:], (self._clock(), int(data["step"]))]
        if data.get("checkpoint"):  # the runtime saw a checkpoint saved: training moved
            gen.advanced = True
        self._recorder.event("progress", generation=gen.plan.generation, task=record.task.name,
                             host=record.task.host, **_safe_progress(data))

    def _print_output(self, gen: _Generation | None, message: AgentMessage) -> None:
        body = message.message
        name, text = body.get("task"), body.get("text", "")
        record = gen.records.get(name) if gen and name else None
        label = record.task.label if record else task_label(message.host, name)
        for shown in self._noise.show(label, text, self._log_path(message.host, name)):
            self._printer.task_line(label, shown)
        self._recorder.log_line(log_file_name(message.host, name), text)
        if record is None or gen is None or body.get("generation") != gen.plan.generation:
            return
        record.last_activity = self._clock()
        record.tail.append(text)
        if (gen.plan.strategy in WATCHED_STRATEGIES and not gen.tearing_down
                and not gen.finishing()):
            self._watch_output(gen, record, text)
        elif gen.failure is not None and gen.failure.kind == "collective_abort":
            self._refine_root_cause(gen, record, text)

    def _watch_output(self, gen: _Generation, record: TaskRecord, text: str) -> None:
        """A collective abort in a task's output fails the group now, seconds
        before the task would exit by itself."""
        alarm = record.watcher.feed(text)
        if alarm is not None and gen.failure is None:
            self._fail(gen, record, gone=False, kind="collective_abort",
                       reason=f"aborted its collective ops ({alarm.code}): a peer died or hung",
                       last_lines=(alarm.line,))
            self._blame_culprit(gen, record)

    def _refine_root_cause(self, gen: _Generation, record: TaskRecord, text: str) -> None:
        record.watcher.feed(text)
        self._blame_culprit(gen, record)

    def _blame_culprit(self, gen: _Generation, reporter: TaskRecord) -> None:
        """A collective abort is a symptom; blame the peer behind it when known:
        the one TF names a line after the abort ("stopped sending heartbeats"),
        else a peer its agent saw stopped (SIGSTOP): when the coordination
        leader itself is stopped, the others only see a deadline pass."""
        failure = gen.failure
        if failure is None or failure.kind != "collective_abort" \
                or failure.task != reporter.task.label:
            return
        culprit = reporter.watcher.culprit
        blamed = gen.record_of(*culprit) if culprit else None
        framework = strategy_framework(gen.plan.strategy)
        reason = (f"stopped sending {framework} heartbeats (hung, stopped, or cut off); "
                  f"reported by {reporter.task.label}")
        if blamed is None:
            blamed = next((r for r in gen.records.values()
                           if r is not reporter and r.usage.get("status") == "stopped"), None)
            reason = ("was stopped (SIGSTOP, Ctrl-Z or a debugger): its peers' collectives "
                      f"aborted; reported by {reporter.task.label}")
        if blamed is None or blamed is reporter:
            return
        gen.failure = Failure(
            task=blamed.task.label, host=blamed.task.host, generation=gen.plan.generation,
            t=failure.t, kind="hang", reason=reason, last_lines=failure.last_lines,
        )
        self._recorder.event("root_cause", generation=gen.plan.generation,
                             task=blamed.task.name, host=blamed.task.host, kind="hang",
                             reason=reason)
        self._printer.notice(f"root cause: {gen.failure.describe()}")

    def _log_path(self, host: str, name: str | None) -> str:
        """A task's log file as the user may type it (relative when under the cwd)."""
        path = os.path.join(self._recorder.logs_dir, log_file_name(host, name))
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative

    def _on_exit(self, gen: _Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        for shown in self._noise.flush(record.task.label,
                                       self._log_path(record.task.host, record.task.name)):
            self._printer.task_line(record.task.label, shown)
        record.exit_code = body.get("code")
        record.signal = body.get("signal")
        self._recorder.event(
            "task_exited", generation=gen.plan.generation, task=record.task.name,
            host=record.task.host, exit_code=record.exit_code, signal=record.signal,
            stopped_by_launcher=bool(body.get("stopping")),
        )
        tail = tuple(body.get("tail") or ())
        reason = classify_exit(record.exit_code, record.signal, body.get("error"), tail)
        if gen.tearing_down or record.state is TaskState.STOPPING:
            if not body.get("stopping") and record.exit_code == 0 \
                    and record.task.lifetime == "job":
                record.move(TaskState.SUCCEEDED)  # done before the stop reached it
                return
            record.move(TaskState.STOPPED)
            if not body.get("stopping") and record.exit_code != 0:
                # It died by itself, maybe before what started the teardown (its
                # exit report waits for its output to drain): it may be the cause.
                self._consider(gen, self._failure(gen, record, kind=_exit_kind(record),
                                                  reason=reason, t=body.get("t"),
                                                  last_lines=tail, error=body.get("error")))
            return
        if record.exit_code == 0:  # a job task done, or a service that may end (evaluator)
            record.move(TaskState.SUCCEEDED)
            return
        if self._worker_restarts_alone(gen, record):
            self._printer.notice(
                f"{record.task.label} {reason}; ParameterServerStrategy reschedules its "
                "work: restarting that worker alone")
            self._recorder.event("task_restarted", generation=gen.plan.generation,
                                 task=record.task.name, host=record.task.host,
                                 exit_code=record.exit_code, signal=record.signal)
            record.move(TaskState.FAILED)
            self._start(gen, record.task)
            return
        self._fail(gen, record, kind=_exit_kind(record), t=body.get("t"), reason=reason,
                   last_lines=tail, error=body.get("error"))

    def _worker_restarts_alone(self, gen: _Generation, record: TaskRecord) -> bool:
        """Under ParameterServerStrategy a worker's death does not fail the job:
        the coordinator reschedules its closures; the worker is started again
        on the same address so the cluster regains its capacity."""
        if gen.plan.strategy != Strategy.PARAMETER_SERVER or record.task.role != "worker":
            return False
        gen.single_restarts[record.task.name] = gen.single_restarts.get(record.task.name, 0) + 1
        return gen.single_restarts[record.task.name] <= MAX_SINGLE_WORKER_RESTARTS

    def _host_lost(self, gen: _Generation, host: str, detail: str) -> None:
        if host in gen.lost_hosts:
            return
        gen.lost_hosts.add(host)
        self._recorder.event("host_lost", generation=gen.plan.generation, host=host,
                             detail=detail)
        self._printer.notice(f"lost host {host}: {detail}")
        link = self._links.get(host)
        if link is not None:
            link.close()  # if the agent is merely stuck, EOF makes it kill its tasks
        for record in gen.records.values():
            if record.task.host != host or record.state.terminal:
                continue
            if gen.tearing_down:
                record.move(TaskState.LOST)
                if gen.failure is not None:  # a primary cause, if what we have is a symptom
                    self._consider(gen, self._failure(gen, record, kind="host_lost",
                                                      reason=f"lost its host: {detail}"))
            else:
                self._fail(gen, record, gone=False, kind="host_lost",
                           reason=f"lost its host: {detail}")
                record.move(TaskState.LOST)

    def _failure(self, gen: _Generation, record: TaskRecord, *, kind: str, reason: str,
                 t: float | None = None, last_lines: tuple[str, ...] = (),
                 error: dict[str, Any] | None = None) -> Failure:
        return Failure(
            task=record.task.label, host=record.task.host, generation=gen.plan.generation,
            t=t if t is not None else self._wall(), kind=kind, reason=reason,
            exit_code=record.exit_code, signal=record.signal, last_lines=last_lines,
            error=error,
        )

    def _fail(self, gen: _Generation, record: TaskRecord, gone: bool = True,
              **details: Any) -> None:
        """Record a failure of `record`; `gone` when its process is known to be
        over. A hung or aborting task is still running: it stays so until the
        teardown confirms its exit."""
        if gone:
            record.move(TaskState.FAILED)
        failure = self._failure(gen, record, **details)
        if gen.failure is None:
            self._recorder.event("failure_detected", generation=gen.plan.generation,
                                 task=record.task.name, host=record.task.host,
                                 kind=failure.kind, exit_code=record.exit_code,
                                 signal=record.signal, reason=failure.reason)
            self._printer.notice(f"failure: {failure.describe()}")
        self._consider(gen, failure)

    def _consider(self, gen: _Generation, failure: Failure) -> None:
        """The earliest primary failure is the root cause, not the peers that
        failed because of it (their symptoms may even be reported first)."""
        current = gen.failure
        if current is None or (
            (failure.secondary, failure.t) < (current.secondary, current.t)
            and failure.task != current.task
        ):
            if current is not None:
                self._printer.notice(f"root cause: {failure.describe()}")
            gen.failure = failure

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

    def _on_stop_request(self, gen: _Generation, hurry: bool) -> None:
        if gen.interrupted is None:
            gen.interrupted = self._stop_signal
            self._recorder.event("stop_requested", generation=gen.plan.generation,
                                 signal=self._stop_signal)
            name = signals.Signals(self._stop_signal).name if self._stop_signal else "stop"
            self._printer.notice(
                f"{name}: stopping every task (SIGTERM, SIGKILL after "
                f"{gen.plan.grace_s:g} s; press Ctrl-C again to kill now)")
        self._begin_teardown(gen, grace_s=0.0 if hurry else None)

    def _begin_teardown(self, gen: _Generation, grace_s: float | None = None) -> None:
        if gen.tearing_down and grace_s is None:
            return
        grace = gen.plan.grace_s if grace_s is None else grace_s
        for record in gen.records.values():
            if not record.state.terminal:
                record.move(TaskState.STOPPING)
        # Every host of the job, whatever we believe of its tasks: stopping is
        # idempotent, and a task we think is over may still be running.
        for host in {t.host for t in gen.plan.tasks} - gen.lost_hosts:
            link = self._links.get(host)
            if link is not None:
                link.send({"op": "stop", "tasks": None, "grace_s": grace})
        gen.teardown_deadline = self._clock() + grace + TEARDOWN_SLACK_S

    def _collecting_stacks(self, gen: _Generation) -> bool:
        """True while a stuck job's Python stacks are on their way: asked for
        once, before the teardown, and waited for at most STACKS_WAIT_S."""
        if gen.failure is None or gen.failure.kind not in STUCK_KINDS:
            return False
        now = self._clock()
        if gen.stacks_deadline is None:
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
                self._printer.notice(f"taking the Python stacks of {len(gen.stacks_pending)} "
                                     "task(s) before stopping them")
        return bool(gen.stacks_pending) and now < gen.stacks_deadline

    def _on_stacks(self, gen: _Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        gen.stacks_pending.discard(record.task.name)
        text = body["text"]
        path = self._recorder.write_stacks(
            record.task.name, record.task.label, gen.plan.generation,
            text or f"(no stacks: {body['error'] or 'the task wrote none'})")
        self._recorder.event("stacks", generation=gen.plan.generation, task=record.task.name,
                             host=record.task.host, file=str(path), taken=bool(text))
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

    def _give_up_on_stragglers(self, gen: _Generation) -> None:
        """Tasks whose exit no agent confirmed: their hosts count as lost, so the
        next generation gets a fresh agent there (or goes on without them)."""
        for record in gen.records.values():
            if not record.state.terminal:
                record.move(TaskState.LOST)
                self._printer.notice(f"{record.task.label}: no exit confirmed by its agent")
                if record.task.host not in gen.lost_hosts:
                    gen.lost_hosts.add(record.task.host)
                    link = self._links.get(record.task.host)
                    if link is not None:
                        link.close()


def _repeated_failure(failures: list[Failure]) -> str:
    """The last failure's description when it repeats the one before it: the
    same exception type raised at the same innermost frame. "" otherwise."""
    if len(failures) < 2:
        return ""
    last, before = failures[-1], failures[-2]
    if last.secondary or before.secondary:
        return ""  # a peer's loss seen twice (gRPC UNAVAILABLE...): not the script's bug
    where = innermost_frame(last.error)
    if where is None or where != innermost_frame(before.error):
        return ""
    kind, path, line, function = where
    return f"{kind} at {path}:{line} in {function}, in {last.task}"


def _number(value: Any) -> float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _last_words(record: TaskRecord) -> str:
    return repr(record.tail[-1][:200]) if record.tail else "nothing"


def innermost_frames(stacks: str, count: int = 5) -> tuple[str, ...]:
    """The innermost frames of the main thread in a faulthandler dump.

    faulthandler lists threads newest first, so the main thread (the oldest)
    comes last; within a thread the most recent call comes first.
    """
    blocks: list[list[str]] = []
    for line in stacks.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif blocks and line.strip().startswith("File "):
            blocks[-1].append(line.strip())
    with_frames = [block for block in blocks if block]
    return tuple(with_frames[-1][:count]) if with_frames else ()


def _close_late_link(done: threading.Event, outcome: list) -> None:
    """An abandoned reconnection may still succeed: close what it brings."""
    done.wait()
    if outcome and isinstance(outcome[0], AgentLink):
        outcome[0].close()


def _exit_kind(record: TaskRecord) -> str:
    if record.exit_code == RESTART_ME_EXIT:
        return "preempted"
    return "signal" if record.signal is not None else "exit"


def _safe_progress(data: dict[str, Any]) -> dict[str, Any]:
    reserved = {"t", "event", "generation", "task", "host"}
    return {k: v for k, v in data.items() if k not in reserved}
