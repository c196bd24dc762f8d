"""The supervisor: one loop that starts, watches, tears down and restarts a job.

Owns all run-time state. Agents' reader threads push `AgentMessage`s into one
queue; only the supervisor thread mutates state, writes the run directory and
prints. Outcomes are values (`RunResult`); exceptions are for the launcher's
own faults. Signals only set a flag (`request_stop`), read by the loop.

Must not import: cli. Talks to hosts only through `AgentLink`s.
"""

from __future__ import annotations

import enum
import queue
import signal as signals
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .plan import Plan, Task
from .printer import Printer
from .rundir import RunRecorder
from .transport import AgentLink, AgentMessage

POLL_S = 0.1
# After the grace period's SIGKILL, how long to wait for agents to confirm
# every exit before giving up on a task (its host is then unreachable).
TEARDOWN_SLACK_S = 5.0
# A ParameterServerStrategy worker that keeps dying is a real failure.
MAX_SINGLE_WORKER_RESTARTS = 5


class TaskState(enum.Enum):
    """Lifecycle of one task within one generation.

    PENDING  -> STARTING   start sent to the agent
    STARTING -> RUNNING    agent reported `started`
    RUNNING  -> SUCCEEDED  exited 0 (on its own)
    STARTING/RUNNING -> FAILED    non-zero exit, signal, start failure, host lost
    STARTING/RUNNING -> STOPPING  teardown began (SIGTERM sent)
    STOPPING -> STOPPED    exit confirmed during teardown
    STOPPING -> LOST       no confirmation within grace + slack (host unreachable)
    """

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPING = "stopping"
    STOPPED = "stopped"
    LOST = "lost"

    @property
    def terminal(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.STOPPED, TaskState.LOST)


@dataclass
class TaskRecord:
    """What the supervisor knows of one task (mutated by the supervisor thread only)."""

    task: Task
    state: TaskState = TaskState.PENDING
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    last_output_at: float | None = None
    last_progress: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """The first thing that went wrong in a generation: the root cause."""

    task: str  # label, e.g. host1/worker1
    host: str
    generation: int
    t: float
    kind: str  # exit | signal | start_failed | host_lost
    exit_code: int | None = None
    signal: int | None = None
    last_lines: tuple[str, ...] = ()
    error: dict[str, Any] | None = None
    detail: str = ""

    def describe(self) -> str:
        if self.kind == "signal" and self.signal is not None:
            try:
                name = signals.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            what = f"was killed by signal {self.signal} ({name})"
        elif self.kind == "exit":
            what = f"exited with code {self.exit_code}"
        elif self.kind == "start_failed":
            what = f"could not start: {self.detail}"
        else:
            what = f"lost its host: {self.detail or 'agent connection closed'}"
        if self.error:
            what += f" after {self.error.get('type')}: {self.error.get('message', '')[:300]}"
        return f"{self.task} (host {self.host}, generation {self.generation}) {what}"

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "host": self.host,
            "generation": self.generation,
            "t": self.t,
            "kind": self.kind,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "description": self.describe(),
            "last_lines": list(self.last_lines),
            "error": self.error,
        }


@dataclass(frozen=True)
class RunResult:
    status: str  # succeeded | failed | interrupted
    restarts: int
    wall_s: float
    root_cause: Failure | None
    tasks: dict[str, dict[str, Any]]
    interrupted_by: int | None = None  # signal number for `interrupted`
    failures: tuple[Failure, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "restarts": self.restarts,
            "wall_s": round(self.wall_s, 3),
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            "interrupted_by": self.interrupted_by,
            "failures": [f.to_json() for f in self.failures],
            "tasks": self.tasks,
        }


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 0
    backoff_s: float = 1.0


@dataclass
class _Generation:
    plan: Plan
    records: dict[str, TaskRecord]
    failure: Failure | None = None
    teardown_deadline: float | None = None
    interrupted: int | None = None
    single_restarts: dict[str, int] = field(default_factory=dict)

    @property
    def tearing_down(self) -> bool:
        return self.teardown_deadline is not None

    def all_terminal(self) -> bool:
        return all(r.state.terminal for r in self.records.values())

    def jobs_done(self) -> bool:
        """Every task that must finish by itself has exited 0."""
        return all(r.state is TaskState.SUCCEEDED
                   for r in self.records.values() if r.task.lifetime == "job")

    def services_left(self) -> bool:
        return any(not r.state.terminal
                   for r in self.records.values() if r.task.lifetime == "service")


class Supervisor:
    def __init__(
        self,
        make_plan: Callable[[int], Plan],
        links: dict[str, AgentLink],
        events: queue.Queue[AgentMessage],
        recorder: RunRecorder,
        printer: Printer,
        policy: RestartPolicy,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._make_plan = make_plan
        self._links = links
        self._events = events
        self._recorder = recorder
        self._printer = printer
        self._policy = policy
        self._clock = clock
        self._wall = wall_clock
        self._stop_signal: int | None = None
        self._stop_count = 0
        self._labels: dict[str, str] = {}

    # ----------------------------------------------------------------- control

    def request_stop(self, signum: int) -> None:
        """Safe from a signal handler: only records the request."""
        self._stop_signal = signum
        self._stop_count += 1

    # -------------------------------------------------------------------- run

    def run(self) -> RunResult:
        started = self._clock()
        restarts = 0
        failures: list[Failure] = []
        generation = 0
        while True:
            plan = self._make_plan(generation)
            state = self._run_generation(plan)
            tasks = {r.task.label: _final_state(r) for r in state.records.values()}
            if state.interrupted is not None:
                status, interrupted_by = "interrupted", state.interrupted
                break
            if state.failure is None:
                status, interrupted_by = "succeeded", None
                break
            failures.append(state.failure)
            if restarts >= self._policy.max_restarts:
                status, interrupted_by = "failed", None
                if self._policy.max_restarts:
                    self._printer.notice(f"giving up after {restarts} restarts")
                break
            restarts += 1
            generation += 1
            self._recorder.event("restart", generation=generation, restarts=restarts,
                                 backoff_s=self._policy.backoff_s)
            self._printer.notice(
                f"restarting (restart {restarts} of at most {self._policy.max_restarts}) "
                f"in {self._policy.backoff_s:g} s; workers resume from the last checkpoint"
            )
            if self._wait_backoff():
                status, interrupted_by = "interrupted", self._stop_signal
                break
        result = RunResult(
            status=status,
            restarts=restarts,
            wall_s=self._clock() - started,
            # The failure that ended the job; earlier generations' are in `failures`.
            root_cause=failures[-1] if failures and status == "failed" else None,
            tasks=tasks,
            interrupted_by=interrupted_by,
            failures=tuple(failures),
        )
        self._recorder.event("job_done", status=result.status, restarts=restarts,
                             wall_s=round(result.wall_s, 3))
        return result

    def _wait_backoff(self) -> bool:
        """Sleep the backoff, draining events; True when interrupted meanwhile."""
        deadline = self._clock() + self._policy.backoff_s
        while self._clock() < deadline:
            if self._stop_signal is not None:
                return True
            self._next_message(min(POLL_S, max(0.0, deadline - self._clock())))
        return self._stop_signal is not None

    def _next_message(self, timeout: float) -> AgentMessage | None:
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def _run_generation(self, plan: Plan) -> _Generation:
        gen = _Generation(plan, {t.name: TaskRecord(t) for t in plan.tasks})
        self._labels = {t.name: t.label for t in plan.tasks}
        self._recorder.event(
            "launch", generation=plan.generation,
            tasks=[{"task": t.name, "host": t.host, "address": t.address, "port": t.port}
                   for t in plan.tasks],
        )
        for task in plan.tasks:
            self._start(gen, task)
        handled_stops = 0
        while True:
            if self._stop_count > handled_stops:
                handled_stops = self._stop_count
                self._on_stop_request(gen, hurry=handled_stops > 1)
            message = self._next_message(POLL_S)
            if message is not None:
                self._handle(gen, message)
            if gen.tearing_down:
                if gen.all_terminal():
                    break
                if self._clock() > gen.teardown_deadline:
                    self._give_up_on_stragglers(gen)
                    break
            elif gen.failure is not None:
                self._begin_teardown(gen)
            elif gen.jobs_done():
                if not gen.services_left():
                    return gen
                # Servers (ps, PS-strategy workers) never exit by themselves.
                self._printer.notice("training finished; stopping the servers")
                self._begin_teardown(gen)
        self._recorder.event("teardown_done", generation=plan.generation)
        return gen

    def _start(self, gen: _Generation, task: Task) -> None:
        record = gen.records[task.name]
        link = self._links[task.host]
        record.state = TaskState.STARTING
        sent = link.send({
            "op": "start",
            "task": task.name,
            "generation": gen.plan.generation,
            "argv": list(task.argv),
            "cwd": task.cwd,
            "env": dict(task.env),
            "tf_config": task.tf_config_json(),
        })
        if not sent:
            self._fail(gen, record, kind="host_lost", detail="agent connection is closed")

    # --------------------------------------------------------------- messages

    def _handle(self, gen: _Generation, message: AgentMessage) -> None:
        body = message.message
        event = message.event
        if event == "agent_lost":
            self._on_agent_lost(gen, message.host, body.get("detail", ""))
            return
        name = body.get("task")
        record = gen.records.get(name) if name else None
        current = record is not None and body.get("generation", -1) == gen.plan.generation
        if event == "output":
            label = self._labels.get(name, f"{message.host}/{name}")
            log_name = record.task.log_name if record else f"{message.host}-{name}.log"
            self._printer.task_line(label, body.get("text", ""))
            self._recorder.log_line(log_name, body.get("text", ""))
            if record is not None and current:
                record.last_output_at = self._clock()
        elif not current:
            return  # a late message about a previous generation
        elif event == "started":
            record.pid = body.get("pid")
            record.started_at = self._clock()
            if record.state is TaskState.STARTING:
                record.state = TaskState.RUNNING
            self._recorder.event("task_started", generation=gen.plan.generation,
                                 task=name, host=record.task.host, pid=record.pid)
        elif event == "start_failed":
            self._fail(gen, record, kind="start_failed", detail=body.get("error", ""),
                       t=body.get("t"))
        elif event == "exited":
            self._on_exit(gen, record, body)
        elif event == "progress":
            record.last_progress = body.get("data", {})
            self._recorder.event("progress", generation=gen.plan.generation, task=name,
                                 host=record.task.host, **_safe_progress(record.last_progress))
        elif event == "heartbeat":
            pass  # per-task usage arrives keyed by task name, below

        if event == "heartbeat":
            for task_name, usage in (body.get("tasks") or {}).items():
                if task_name in gen.records:
                    gen.records[task_name].usage = usage

    def _on_exit(self, gen: _Generation, record: TaskRecord, body: dict[str, Any]) -> None:
        record.exit_code = body.get("code")
        record.signal = body.get("signal")
        self._recorder.event(
            "task_exited", generation=gen.plan.generation, task=record.task.name,
            host=record.task.host, exit_code=record.exit_code, signal=record.signal,
            stopped_by_launcher=bool(body.get("stopping")),
        )
        if gen.tearing_down or record.state is TaskState.STOPPING:
            record.state = TaskState.STOPPED
        elif record.exit_code == 0 and record.task.lifetime == "job":
            record.state = TaskState.SUCCEEDED
        elif self._worker_restarts_alone(gen, record):
            self._printer.notice(
                f"{record.task.label} {_exit_text(record)}; ParameterServerStrategy "
                "reschedules its work: restarting that worker alone")
            self._recorder.event("task_restarted", generation=gen.plan.generation,
                                 task=record.task.name, host=record.task.host,
                                 exit_code=record.exit_code, signal=record.signal)
            self._start(gen, record.task)
        else:
            self._fail(
                gen, record,
                kind="signal" if record.signal is not None else "exit",
                t=body.get("t"),
                last_lines=tuple(body.get("tail") or ()),
                error=body.get("error"),
            )

    def _worker_restarts_alone(self, gen: _Generation, record: TaskRecord) -> bool:
        """Under ParameterServerStrategy a worker's death does not fail the job:
        the coordinator reschedules its closures; the worker is started again
        on the same address so the cluster regains its capacity."""
        if gen.plan.strategy != "parameter_server" or record.task.role != "worker":
            return False
        gen.single_restarts[record.task.name] = gen.single_restarts.get(record.task.name, 0) + 1
        return gen.single_restarts[record.task.name] <= MAX_SINGLE_WORKER_RESTARTS

    def _on_agent_lost(self, gen: _Generation, host: str, detail: str) -> None:
        self._printer.notice(f"lost the agent of host {host}: {detail or 'connection closed'}")
        for record in gen.records.values():
            if record.task.host != host or record.state.terminal:
                continue
            if gen.tearing_down:
                record.state = TaskState.LOST
            else:
                self._fail(gen, record, kind="host_lost", detail=detail)

    def _fail(self, gen: _Generation, record: TaskRecord, *, kind: str, t: float | None = None,
              detail: str = "", last_lines: tuple[str, ...] = (),
              error: dict[str, Any] | None = None) -> None:
        record.state = TaskState.FAILED
        failure = Failure(
            task=record.task.label, host=record.task.host, generation=gen.plan.generation,
            t=t if t is not None else self._wall(), kind=kind, exit_code=record.exit_code,
            signal=record.signal, last_lines=last_lines, error=error, detail=detail,
        )
        # The earliest failure is the root cause, not the peers that failed after it.
        if gen.failure is None or failure.t < gen.failure.t:
            if gen.failure is None:
                self._recorder.event("failure_detected", generation=gen.plan.generation,
                                     task=record.task.name, host=record.task.host,
                                     kind=kind, exit_code=record.exit_code,
                                     signal=record.signal)
                self._printer.notice(f"failure: {failure.describe()}")
            gen.failure = failure

    # -------------------------------------------------------------- teardown

    def _on_stop_request(self, gen: _Generation, hurry: bool) -> None:
        if gen.interrupted is None:
            gen.interrupted = self._stop_signal
            name = signals.Signals(self._stop_signal).name if self._stop_signal else "stop"
            self._printer.notice(
                f"{name}: stopping every task (SIGTERM, SIGKILL after "
                f"{gen.plan.grace_s:g} s; press Ctrl-C again to kill now)")
        self._begin_teardown(gen, grace_s=0.0 if hurry else None)

    def _begin_teardown(self, gen: _Generation, grace_s: float | None = None) -> None:
        grace = gen.plan.grace_s if grace_s is None else grace_s
        if gen.tearing_down and grace_s is None:
            return
        for record in gen.records.values():
            if not record.state.terminal:
                record.state = TaskState.STOPPING
        for host, link in self._links.items():
            if any(r.task.host == host and r.state is TaskState.STOPPING
                   for r in gen.records.values()):
                link.send({"op": "stop", "tasks": None, "grace_s": grace})
        gen.teardown_deadline = self._clock() + grace + TEARDOWN_SLACK_S

    def _give_up_on_stragglers(self, gen: _Generation) -> None:
        for record in gen.records.values():
            if not record.state.terminal:
                record.state = TaskState.LOST
                self._printer.notice(f"{record.task.label}: no exit confirmed by its agent")


def _exit_text(record: TaskRecord) -> str:
    if record.signal is not None:
        return f"was killed by signal {record.signal}"
    return f"exited with code {record.exit_code}"


def _final_state(record: TaskRecord) -> dict[str, Any]:
    return {
        "host": record.task.host,
        "role": record.task.role,
        "index": record.task.index,
        "state": record.state.value,
        "exit_code": record.exit_code,
        "signal": record.signal,
        "pid": record.pid,
        "last_progress": record.last_progress,
    }


def _safe_progress(data: dict[str, Any]) -> dict[str, Any]:
    reserved = {"t", "event", "generation", "task", "host"}
    return {k: v for k, v in data.items() if k not in reserved}
