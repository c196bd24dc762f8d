"""The story of a run: every event kind, one typed record each, and its JSON line.

The supervisor decides and tells; it formats no text for people. Each thing
that happens is one of the frozen records below, handed to the run
directory's recorder (one JSON line of `events.jsonl`) and to the views that
listen (`Listener`: the printer turns an event into its line,
launcher/views/narrate.py). `status` reads the lines back with
`eventlines.from_record` (job/record/eventlines.py).

The JSON line of an event is `{"t": ..., "event": <kind>, "v": 2, <fields>}`:
its fields in the order declared here, under the names `events.jsonl` always
had (additions only). `v` is the schema version (`rundir.EVENTS_SCHEMA`); a
line without it was written before the version existed: version 1, the same
kinds and keys, fewer of them. A reader keeps what it does not know: an
unknown kind reads as `Unknown`, unknown keys land in `extra`.

The base records are job/record/eventbase.py's; the training's own kinds (where a
generation resumed, a resume behind the last save, the memory tier's copies,
a loss or a save gone non-finite) are job/record/training_events.py's; `KINDS` lists
every kind. A few events are told, not written (`recorded = False`): an
agent's own diagnostics, which may be many and say nothing of the job's state.

Pure values; no I/O but through the recorder handed to `write`. Must not
import views, commands or cli.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...spec.rundir import EVENTS_SCHEMA, RunRecorder
from .eventbase import Event, TaskEvent
from .training_events import (
    BatchSkipDone,
    BatchSkipped,
    LossSpike,
    MemoryCopy,
    Nonfinite,
    NonfiniteSave,
    ReplayPassed,
    ResumeBehind,
    Resumed,
)


@dataclass(frozen=True, kw_only=True)
class Placed:
    """One task of a `launch` event: where it runs."""

    task: str
    host: str
    address: str | None = None
    port: int | None = None
    address_rule: str | None = None
    lifetime: str = "job"  # "service" tasks (ps) run until the launcher stops them


# ------------------------------------------------------------- a generation


@dataclass(frozen=True, kw_only=True)
class Launch(Event):
    kind = "launch"
    optional = ("launcher_pid", "launcher_host", "command", "hosts")
    generation: int
    launcher_pid: int | None = None
    launcher_host: str | None = None
    tasks: tuple[Placed, ...] = ()
    # Generation 0 only: what ran and on what (`mgpu-launch report` shows them).
    command: tuple[str, ...] | None = None  # the script and its arguments, as every task runs
    # Per host, from its agent's hello: host, hostname, mgpu_launch (version),
    # python (version), tensorflow, keras, tf_keras (None: not installed).
    hosts: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True, kw_only=True)
class TaskStarting(TaskEvent):
    """The task's start sent to its host's agent (`task_started`: the answer)."""

    kind = "task_starting"


@dataclass(frozen=True, kw_only=True)
class TaskStarted(TaskEvent):
    kind = "task_started"
    pid: int | None = None
    start: str = "cold"  # "warm": a standby took the task (launcher/standby.py)
    start_reason: str = ""


@dataclass(frozen=True, kw_only=True)
class StartFailed(TaskEvent):
    kind = "start_failed"
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Cluster(TaskEvent):
    kind = "cluster"
    state: str = ""  # joining | joined (MultiWorkerMirroredStrategy's setup)


@dataclass(frozen=True, kw_only=True)
class Progress(TaskEvent):
    """The runtime's report; its metrics are keys of the line itself."""

    kind = "progress"
    metrics: dict[str, Any] = field(default_factory=dict)  # step, loss, epoch, ...


@dataclass(frozen=True, kw_only=True)
class TaskExited(TaskEvent):
    kind = "task_exited"
    exit_code: int | None = None
    signal: int | None = None
    stopped_by_launcher: bool = False


@dataclass(frozen=True, kw_only=True)
class TaskRestarted(TaskEvent):
    """A ParameterServerStrategy worker restarted alone: a failure the job survives."""

    kind = "task_restarted"
    optional = ("at", "last_lines", "error")
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    failure: str = dataclasses.field(default="", metadata={"key": "kind"})
    at: float | None = None  # when it happened, as its host saw it (t: when told)
    last_lines: tuple[str, ...] | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class TaskUnconfirmed(TaskEvent):
    """No agent confirmed the task's exit within the teardown: counted lost."""

    kind = "task_unconfirmed"


@dataclass(frozen=True, kw_only=True)
class FailureDetected(TaskEvent):
    kind = "failure_detected"
    optional = ("at", "last_lines", "error")
    failure: str = dataclasses.field(default="", metadata={"key": "kind"})
    exit_code: int | None = None
    signal: int | None = None
    reason: str = ""
    # What status, the report and summary.json show of it (left out when unknown):
    at: float | None = None  # when it happened, as its host saw it (t: when told)
    last_lines: tuple[str, ...] | None = None  # its last output lines
    error: dict[str, Any] | None = None  # the Python exception: type, message, traceback


@dataclass(frozen=True, kw_only=True)
class RootCause(TaskEvent):
    """A later finding names another task as the generation's root cause."""

    kind = "root_cause"
    optional = ("exit_code", "signal", "at", "last_lines", "error")
    failure: str = dataclasses.field(default="", metadata={"key": "kind"})
    reason: str = ""
    exit_code: int | None = None  # as failure_detected's
    signal: int | None = None
    at: float | None = None
    last_lines: tuple[str, ...] | None = None
    error: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class StacksRequested(Event):
    kind = "stacks_requested"
    generation: int
    tasks: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Stacks(TaskEvent):
    kind = "stacks"
    optional = ("frames",)
    file: str = ""
    taken: bool = False
    frames: tuple[str, ...] | None = None  # the innermost frames of the root cause's stacks


@dataclass(frozen=True, kw_only=True)
class StopRequested(Event):
    kind = "stop_requested"
    generation: int
    signal: int | None = None
    grace_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TeardownBegun(Event):
    kind = "teardown_begun"
    generation: int
    # failure | stop | finished (servers stopped once training is done) | done
    # (job/detect/tailcut.py)
    why: str = ""
    grace_s: float = 0.0
    settle_s: float = 0.0  # the SIGTERM this much later (the peers' own exits heard first)


@dataclass(frozen=True, kw_only=True)
class TeardownDone(Event):
    kind = "teardown_done"
    generation: int


# -------------------------------------------------------------------- hosts


@dataclass(frozen=True, kw_only=True)
class HostLost(Event):
    kind = "host_lost"
    generation: int
    host: str
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class HostWait(Event):
    kind = "host_wait"
    host: str
    timeout_s: float = 0.0
    detail: str = ""  # why the first reconnection failed


@dataclass(frozen=True, kw_only=True)
class HostBack(Event):
    kind = "host_back"
    host: str
    attempts: int = 1


@dataclass(frozen=True, kw_only=True)
class HostsChosen(Event):
    """The hosts of the next generation after a loss (recovery.choose_hosts)."""

    kind = "hosts_chosen"
    hosts: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    message: str = ""  # what changed: spares, waits, hosts gone on without


@dataclass(frozen=True, kw_only=True)
class Reaped(Event):
    kind = "reaped"
    host: str
    tasks: tuple[str, ...] = ()
    count: int = 0


@dataclass(frozen=True, kw_only=True)
class BadMessage(Event):
    kind = "bad_message"
    host: str
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class AgentLog(Event):
    """An agent's own diagnostics (told, not written)."""

    kind = "agent_log"
    recorded = False
    host: str
    text: str = ""
    notice: bool = False  # shown always; else only with --verbose


# ---------------------------------------------------------------------- job


@dataclass(frozen=True, kw_only=True)
class JobPhase(Event):
    """The job's phase moved (`Generation.tell_phase`, job/record/phases.py): starting, running
    (every task started), failing, stopping, waiting_for_host, restarting; then `job_done`."""

    kind = "job_phase"
    generation: int
    phase: str = ""


@dataclass(frozen=True, kw_only=True)
class LauncherFailed(Event):
    """The launcher's own fault (an exception, or no next plan: `plan`) ended the job."""

    kind = "launcher_failed"
    error_type: str = ""  # the exception's class name
    error: str = ""  # its message
    plan: bool = False  # planning the next generation failed (e.g. too few hosts left)


@dataclass(frozen=True, kw_only=True)
class Restart(Event):
    kind = "restart"
    optional = ("fence_s", "skipped", "free")
    generation: int
    restarts: int = 0
    counted: bool = True
    progress: bool = False
    hosts: tuple[str, ...] = ()
    backoff_s: float = 0.0
    spent: int = 0  # restarts without progress so far...
    max_restarts: int = 0  # ...of restart.max_restarts
    total: int = 0  # restarts counted against...
    max_total_restarts: int = 0  # ...restart.max_total_restarts
    preempted: bool = False
    # Seconds waited beyond the backoff for a lost host's tasks to be surely
    # over (its agent's lease, then its kill: job/policy/fence.py).
    fence_s: float | None = None
    # The restart skips a bad batch (`batch_skipped`, just before): free.
    skipped: bool | None = None
    # Free as the first failure of this kind in the job, not the script's bug
    # (job/record/failkinds.py's `free_first`: `nonfinite`, `port_taken`).
    free: str | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointPassedOver(Event):
    kind = "checkpoint_passed_over"  # a restore took an older one (runtime/readable.py)
    generation: int
    task: str
    checkpoint: str = ""  # the one passed over (told once per checkpoint)
    why: str = ""  # what is wrong with it, in words
    kept_in: str = ""  # the folder its files were moved to
    restored: str = ""  # the checkpoint restored instead


@dataclass(frozen=True, kw_only=True)
class KerasSwitched(Event):
    kind = "keras_switched"
    generation: int
    from_: str = dataclasses.field(default="keras3", metadata={"key": "from"})
    to: str = "tf_keras"
    task: str = ""
    why: str = ""


@dataclass(frozen=True, kw_only=True)
class JobDone(Event):
    kind = "job_done"
    optional = ("interrupted_by",)
    status: str
    restarts: int = 0
    wall_s: float = 0.0
    stopped_by: str = ""
    message: str = ""  # why the launcher gave up, when it did
    interrupted_by: int | None = None  # the signal of a stop (status interrupted)


@dataclass(frozen=True, kw_only=True)
class TerminalLost(Event):
    kind = "terminal_lost"
    reason: str = ""
    lost_t: float | None = None


@dataclass(frozen=True, kw_only=True)
class Health(TaskEvent):
    """A task's host signals (launcher/agent/health.py), written at most once a
    minute per task: cumulative counters (seconds), GPU figures when known."""

    kind = "health"
    figures: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Straggler(TaskEvent):
    """A task of a synchronous job slower than its peers (job/detect/stragglers.py)."""

    kind = "straggler"
    slowdown: float = 1.0  # its own work per step against its peers'
    evidence: dict[str, Any] = field(default_factory=dict)  # unit, task, peers (ms)
    source: str = "host"  # host | gpu | trace: what showed it
    samples: int = 0  # the rounds that agreed
    action: str = "warn"  # restart.on_straggler
    # With `replace`: the idle spare that takes its host's place at the next
    # checkpoint ("": none is idle, named only); None (left out) with `warn`.
    spare: str | None = None
    optional = ("spare",)


@dataclass(frozen=True, kw_only=True)
class OutOfStepAhead(TaskEvent):
    """Workers bound to fall out of step, seen before they do: their epochs'
    lengths differ (job/detect/lockstep.py `foresee`). A warning; the job goes on."""

    kind = "out_of_step_ahead"
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class NotifyFailed(Event):
    """A `notify.command` failed, timed out or was not run (launcher/outlets/notify.py)."""

    kind = "notify_failed"
    notify: str = ""  # the notification: failed, restarted, succeeded, stopped, straggler
    exit_code: int | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ProgramOver(TaskEvent):
    """The task's program ended cleanly (the bootstrap's last exit handler):
    what is left is its interpreter's teardown (launcher/job/detect/tailcut.py)."""

    kind = "program_over"


@dataclass(frozen=True, kw_only=True)
class TailCut(Event):
    """The job is done but for tasks that sit idle at the final step after a
    peer exited 0 (launcher/job/detect/tailcut.py): the generation ends as finished."""

    kind = "tail_cut"
    optional = ("handlers_cut", "handlers_s")
    generation: int
    tasks: tuple[str, ...] = ()  # host/task of those stopped
    peer: str = ""  # host/task of the one that exited 0
    step: int = 0  # the final step, reported by all
    idle_s: float = 0.0  # how long they sat idle after the peer's exit (or wound down)
    # idle: at the final step; over: their programs ended cleanly; session: a
    # legacy job's tasks waiting for a TF1 session that needs `peer`, which exited 0
    why: str = "idle"
    # Of `tasks`, those stopped in their exit handlers (idle past
    # restart.exit_handlers_s, `handlers_s`): what those did may be unfinished.
    handlers_cut: tuple[str, ...] | None = None
    handlers_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class MetricsServed(Event):
    """Where the job's Prometheus metrics are (launcher/outlets/metrics.py): written
    once, after the first launch, so `status` can say a port chosen at start."""

    kind = "metrics_served"
    optional = ("url", "textfile")
    url: str | None = None
    textfile: str | None = None


@dataclass(frozen=True, kw_only=True)
class Unknown(Event):
    """A line of a kind this version does not know (all its keys in `extra`)."""

    kind = ""
    name: str = ""


KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (
    Launch, TaskStarting, TaskStarted, StartFailed, Cluster, Progress, TaskExited, TaskRestarted,
    TaskUnconfirmed, FailureDetected, RootCause, StacksRequested, Stacks, StopRequested,
    TeardownBegun, TeardownDone, HostLost, HostWait, HostBack, HostsChosen, Reaped,
    BadMessage, AgentLog, Restart, Resumed, ResumeBehind, CheckpointPassedOver,
    KerasSwitched, JobDone, TerminalLost, NotifyFailed, MetricsServed, ProgramOver, TailCut,
    Health, Straggler, JobPhase, LauncherFailed, MemoryCopy, Nonfinite, NonfiniteSave,
    LossSpike, BatchSkipped, BatchSkipDone, ReplayPassed)}

# Keys of a progress line that are not metrics.
_PROGRESS_RESERVED = frozenset({"t", "event", "v", "generation", "task", "host"})


class Listener(Protocol):
    """A view of the story, told every event as it happens (supervisor thread: no blocking)."""

    def tell(self, event: Event) -> None: ...


# ------------------------------------------------------------------ writing


def keys(cls: type[Event]) -> list[str]:
    """The JSON keys of a kind's fields, in order (as docs/operations.md lists them)."""
    return [f.metadata.get("key", f.name) for f in dataclasses.fields(cls)
            if f.name not in ("t", "extra") and not (cls is Progress and f.name == "metrics")]


def fields_of(event: Event) -> dict[str, Any]:
    """The event's keys and values as its JSON line holds them (no t, event, v)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        if f.name in ("t", "extra"):
            continue
        value = getattr(event, f.name)
        if value is None and f.name in event.optional:
            continue
        if f.name == "metrics":
            out.update({k: v for k, v in value.items() if k not in _PROGRESS_RESERVED})
            continue
        out[f.metadata.get("key", f.name)] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: v for k, v in dataclasses.asdict(value).items()}
    return value


def to_record(event: Event, t: float) -> dict[str, Any]:
    """The event as one line of events.jsonl (a dict: json.dumps makes the line)."""
    return {"t": t, "event": event.kind, "v": EVENTS_SCHEMA, **fields_of(event)}


def write(recorder: RunRecorder, event: Event, at: float | None = None) -> None:
    """Append `event` to the run's events.jsonl (the recorder stamps `t` and `v`;
    `at`: the time it happened, for a line written late: job/run/samples.py)."""
    if event.recorded:
        recorder.event(event.kind, **fields_of(event), **({"t": at} if at is not None else {}))
