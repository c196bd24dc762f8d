"""Values the supervisor works with: task states, failures, the run's result.

Owns no behaviour beyond describing itself; the supervisor mutates
`TaskRecord`s from its own thread only. `RunResult` is what `run()` returns
and what `summary.json` holds.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ...spec.plan import Task
from . import events as ev
from . import failkinds
from .classify import OutputWatcher


class JobStatus(enum.StrEnum):
    """How a job ended (summary.json's `status`; a str, so JSON and text read it as is)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class TaskState(enum.Enum):
    """Lifecycle of one task within one generation; `TRANSITIONS` lists the legal moves.

    PENDING  -> STARTING   start sent to the agent (`task_starting`)
    STARTING -> RUNNING    agent reported `started`
    RUNNING  -> SUCCEEDED  exited 0 by itself (a `job` task)
    STARTING/RUNNING -> FAILED    non-zero exit, signal, start failure (the process is over)
    STARTING/RUNNING -> LOST      its host was lost (its agent kills it, unconfirmed)
    STARTING/RUNNING -> STOPPING  teardown began (SIGTERM sent)
    STOPPING -> STOPPED    exit confirmed during teardown
    STOPPING -> SUCCEEDED  exited 0 by itself before the stop reached it (a `job` task)
    STOPPING -> LOST       no confirmation within grace + slack (host unreachable)
    FAILED   -> STARTING   only a ParameterServerStrategy worker, restarted alone

    A task that hangs or reports a collective abort has failed but is still
    running: it stays RUNNING (the failure is the generation's) until the
    teardown confirms its exit. Only terminal states count as gone.
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


TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    TaskState.PENDING: frozenset({TaskState.STARTING, TaskState.STOPPING, TaskState.LOST}),
    TaskState.STARTING: frozenset({TaskState.RUNNING, TaskState.FAILED, TaskState.LOST,
                                   TaskState.STOPPING}),
    TaskState.RUNNING: frozenset({TaskState.SUCCEEDED, TaskState.FAILED, TaskState.LOST,
                                  TaskState.STOPPING}),
    TaskState.STOPPING: frozenset({TaskState.STOPPED, TaskState.SUCCEEDED, TaskState.LOST}),
    TaskState.FAILED: frozenset({TaskState.STARTING}),
    TaskState.SUCCEEDED: frozenset(),
    TaskState.STOPPED: frozenset(),
    TaskState.LOST: frozenset(),
}


def apply(state: TaskState, event: ev.Event, *, host: str, lifetime: str = "job") -> TaskState:
    """A task's state after `event`: the one state machine, followed by the
    supervisor as it decides and by the run's model as it folds the events
    (launcher/job/record/story.py: `status`, the report, the metrics, summary.json).

    `event` is one of this task's events (the caller matches the task's name
    and generation), or an event of its whole generation or host. A state the
    event does not move is returned as it is; whether the move is legal is
    the caller's to check (`TaskRecord.move`): the fold takes what was written.
    """
    if isinstance(event, ev.TaskStarting) and state is TaskState.PENDING:
        return TaskState.STARTING  # its start sent (a restarted one: `task_restarted` moved it)
    if isinstance(event, ev.TaskStarted) and state in (TaskState.PENDING, TaskState.STARTING):
        return TaskState.RUNNING
    if isinstance(event, ev.TaskExited):
        return _after_exit(state, event, lifetime)
    if (isinstance(event, ev.StartFailed) or (  # (version 1 wrote no start_failed event)
            isinstance(event, ev.FailureDetected)
            and failkinds.traits(event.failure).ends_the_start)) \
            and state in (TaskState.PENDING, TaskState.STARTING, TaskState.RUNNING):
        return TaskState.FAILED
    if isinstance(event, ev.TaskRestarted) and state is TaskState.FAILED:
        return TaskState.STARTING  # a parameter-server worker, restarted alone
    if state.terminal:
        return state
    if isinstance(event, ev.TeardownBegun):
        return TaskState.STOPPING
    if isinstance(event, ev.HostLost) and event.host == host or \
            isinstance(event, ev.TaskUnconfirmed):
        return TaskState.LOST
    return state


def _after_exit(state: TaskState, event: ev.TaskExited, lifetime: str) -> TaskState:
    if event.stopped_by_launcher:
        return TaskState.STOPPED
    if state is TaskState.STOPPING:  # a job task may finish before the stop reaches it
        return TaskState.SUCCEEDED if event.exit_code == 0 and lifetime == "job" \
            else TaskState.STOPPED
    return TaskState.SUCCEEDED if event.exit_code == 0 else TaskState.FAILED


class IllegalTransition(Exception):
    """A move `TRANSITIONS` does not allow (e.g. a late or forged agent message)."""


@dataclass
class TaskRecord:
    """What the supervisor knows of one task in the current generation."""

    task: Task
    state: TaskState = TaskState.PENDING
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: float | None = None
    last_activity: float | None = None  # output line or progress report (monotonic)
    # Its script's code returned cleanly (monotonic): only exit handlers and teardown left.
    returned_at: float | None = None
    # Its program ended cleanly before any stop (monotonic): only its teardown is left.
    over_at: float | None = None
    last_progress: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)  # cpu, rss_mb, status (heartbeat)
    watcher: OutputWatcher = field(default_factory=OutputWatcher)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=5))  # last output lines
    cluster: str = ""  # "joining" / "joined": the task's MultiWorkerMirroredStrategy setup
    stack: str = ""  # its Python stacks, when taken before a hang teardown

    def move(self, to: TaskState) -> None:
        """The only way a task changes state; raises IllegalTransition otherwise."""
        if to is not self.state and to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.task.name}: {self.state.value} -> {to.value}")
        self.state = to


def sentence(label: str, host: str, generation: int, reason: str) -> str:
    """A failure in words, the one place: the terminal, `status`, the report and
    summary.json all say `host1/worker1 (host host1, generation 0) exited with code 1`."""
    return f"{label} (host {host}, generation {generation}) {reason}"


def reason_of(kind: str, exit_code: int | None, signal: int | None, reason: str) -> str:
    """A failure's reason phrase; one a line lacks (written before reasons were)
    is said from its kind and exit."""
    return str(reason) if reason else failkinds.words(kind, exit_code, signal)


@dataclass(frozen=True)
class Failure:
    """One thing that went wrong; the earliest of a generation is its root cause."""

    task: str  # label, e.g. host1/worker1
    host: str
    generation: int
    t: float  # Unix time it happened (as the host saw it when known)
    kind: str  # a failkinds.Kind (job/record/failkinds.py: what each kind is)
    reason: str  # one phrase a user can act on
    exit_code: int | None = None
    signal: int | None = None
    last_lines: tuple[str, ...] = ()
    error: dict[str, Any] | None = None
    # The innermost frames of its Python stacks, when taken before a hang teardown.
    stack: tuple[str, ...] = ()

    def describe(self) -> str:
        return sentence(self.task, self.host, self.generation, self.reason)

    @property
    def secondary(self) -> bool:
        """A symptom of another task's failure (a collective aborted because a
        peer vanished), never the root cause when the primary one is known."""
        return failkinds.secondary(self.kind, self.reason)

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
            "stack": list(self.stack),
        }


@dataclass(frozen=True)
class RunResult:
    status: JobStatus
    restarts: int
    wall_s: float
    root_cause: Failure | None
    tasks: dict[str, dict[str, Any]]
    interrupted_by: int | None = None  # the signal, for `interrupted`
    failures: tuple[Failure, ...] = ()  # every generation's first failure, in order
    message: str = ""  # why the launcher gave up, when it did
    stopped_by: str = ""  # the rule that ended a failed job (recovery.STOPPED_BY_*)
    # keras: auto restarted the job under tf_keras (launcher/job/policy/keras_fallback.py)
    keras_switched: dict[str, Any] | None = None
    # Where each restarted generation resumed (launcher/job/detect/resumes.py).
    resumed: tuple[dict[str, Any], ...] = ()
    stragglers: tuple[dict[str, Any], ...] = ()  # tasks named by the radar (job/detect/radar.py)

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "restarts": self.restarts,
            "wall_s": round(self.wall_s, 3),
            "root_cause": self.root_cause.to_json() if self.root_cause else None,
            "message": self.message,
            "stopped_by": self.stopped_by or None,
            "interrupted_by": self.interrupted_by,
            "failures": [f.to_json() for f in self.failures],
            "tasks": self.tasks,
            **({"keras_switched": self.keras_switched} if self.keras_switched else {}),
            "resumed": list(self.resumed),
            "stragglers": list(self.stragglers),
        }


def final_state(record: TaskRecord, generation: int) -> dict[str, Any]:
    # A program that ended cleanly succeeded, even when the launcher had to end
    # its interpreter's teardown (job/detect/tailcut.py): its exit says how it went.
    done = record.over_at is not None and record.state is TaskState.STOPPED
    return {
        "host": record.task.host,
        "role": record.task.role,
        "index": record.task.index,
        "generation": generation,
        "state": TaskState.SUCCEEDED.value if done else record.state.value,
        "exit_code": record.exit_code,
        "signal": record.signal,
        "pid": record.pid,
        "last_progress": record.last_progress,
    }
