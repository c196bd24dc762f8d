"""Tasks' output lines: to the terminal (through the `Voice`, TensorFlow's
start-up noise folded), to each task's log file, and watched for a collective
abort, which fails the group seconds before its tasks would exit by themselves.

Called from the supervisor thread only. A collective abort is returned, a
`Found` (job/detect/findings.py) the supervisor acts on, then asks `blame` for the
peer behind it; a new root cause is told as a `RootCause` event.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from ...spec.plan import task_label
from ...spec.rundir import RunRecorder, log_file_name
from ...strategy import COLLECTIVE
from ...transport import AgentMessage
from ..detect.blame import culprit
from ..detect.findings import Found, root_cause
from ..detect.generation import Generation
from ..record import events as ev
from ..record.failkinds import Kind, traits
from ..record.states import TaskRecord
from ..record.story import Beside
from .cascade import CascadeFolder
from .grpcfold import GrpcFolder, Restarting
from .noise import NoiseFolder

# Strategies whose workers all die with a peer: their output tells of it first.
WATCHED_STRATEGIES = COLLECTIVE


class Voice(ev.Listener, Protocol):
    """Where the story goes for people (the operator's printer, launcher/views/
    printer.py, is one): told every event, handed every task's output line and
    what the supervisor alone knows of the tasks (the live table's CPU, memory,
    silence). The supervisor sits below the views and never imports them
    (tests/test_layering.py, floors)."""

    verbose: bool

    def task_line(self, label: str, text: str) -> None: ...
    def refresh(self, beside: Sequence[Beside]) -> None: ...


class TaskOutput:
    def __init__(self, voice: Voice, recorder: RunRecorder, clock: Callable[[], float],
                 tell: Callable[[ev.Event], None]) -> None:
        self._voice = voice
        self._recorder = recorder
        self._clock = clock
        self._tell = tell
        self._noise = NoiseFolder(enabled=not voice.verbose)  # TF start-up: one line a task
        self._cascade = CascadeFolder(enabled=not voice.verbose)  # after a peer failed
        # gRPC errors about a PS worker restarting alone: one line a task and restart
        self._grpc = GrpcFolder(enabled=not voice.verbose)
        self._seen: dict[tuple[int, str], int] = {}  # (generation, worker): restarts seen

    def log_path(self, host: str, name: str | None) -> str:
        """A task's log file as the user may type it (relative when under the cwd)."""
        path = os.path.join(self._recorder.logs_dir, log_file_name(host, name))
        relative = os.path.relpath(path)
        return path if relative.startswith("..") else relative

    def flush(self, record: TaskRecord) -> None:
        """The task exited: what the noise folder held back is shown now."""
        log = self.log_path(record.task.host, record.task.name)
        for shown in [*self._noise.flush(record.task.label, log),
                      *self._cascade.flush(record.task.label, log),
                      *self._grpc.flush(record.task.label, log)]:
            self._voice.task_line(record.task.label, shown)

    def line(self, gen: Generation | None, message: AgentMessage) -> Found | None:
        """One `output` message: shown, logged, and watched; a collective abort found."""
        body = message.message
        name, text = body.get("task"), body.get("text", "")
        record = gen.records.get(name) if gen and name else None
        label = record.task.label if record else task_label(message.host, name)
        failed = gen.failure.task if gen is not None and gen.failure is not None \
            and record is not None and body.get("generation") == gen.plan.generation else None
        if gen is not None:
            self._restarts(gen, record, text)
        if not self._cascade.holds(label, failed):
            for shown in self._noise.show(label, text, self.log_path(message.host, name)):
                for kept in self._grpc.show(label, shown):
                    self._voice.task_line(label, kept)
        self._recorder.log_line(log_file_name(message.host, name), text)
        if record is None or gen is None or body.get("generation") != gen.plan.generation:
            return None
        record.last_activity = self._clock()
        record.tail.append(text)
        if (gen.plan.strategy in WATCHED_STRATEGIES and not gen.tearing_down
                and not gen.finishing()):
            return self._watch(gen, record, text)
        if gen.failure is not None and traits(gen.failure.kind).blames_a_peer:
            record.watcher.feed(text)
            self.blame(gen, record)
        return None

    def _restarts(self, gen: Generation, record: TaskRecord | None, text: str) -> None:
        """The workers restarted alone (ParameterServerStrategy), told to the gRPC
        folder as they restart and as they serve again (the fold lines owed then)."""
        for name, count in gen.single_restarts.items():
            if self._seen.get((gen.plan.generation, name), 0) < count and name in gen.records:
                self._seen[(gen.plan.generation, name)] = count
                task = gen.records[name].task
                self._grpc.restarting(name, Restarting(task.label, task.index, task.address,
                                                       task.port))
        if record is not None and self._grpc.waits_for(record.task.name):
            logs = {r.task.label: self.log_path(r.task.host, r.task.name)
                    for r in gen.records.values()}
            for label, line in self._grpc.back(record.task.name, text,
                                               lambda told: logs.get(told, "its log")):
                self._voice.task_line(label, line)

    def _watch(self, gen: Generation, record: TaskRecord, text: str) -> Found | None:
        """A collective abort in a task's output fails the group now, seconds
        before the task would exit by itself (then `blame` names its culprit)."""
        alarm = record.watcher.feed(text)
        if alarm is not None and gen.failure is None:
            return Found(record, Kind.COLLECTIVE_ABORT, "output", {"code": alarm.code},
                         last_lines=(alarm.line,))
        return None

    def blame(self, gen: Generation, reporter: TaskRecord) -> None:
        """The peer behind a collective abort `reporter` reported, when known."""
        blamed = culprit(gen, reporter)
        if blamed is not None:
            gen.failure = blamed
            self._tell(root_cause(blamed))
