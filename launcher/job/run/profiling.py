"""Synchronized traces of a running job: every task traced at the same moment.

`Profiler.capture(gen, links, seconds)` asks the agent of every host that
runs a task of the generation to have its tasks trace themselves for
`seconds`, all starting `DELAY_S` after the request reaches each agent (the
agents time the start by their own clocks: launcher/agent/profiles.py; the
tasks trace in-process: launcher/runtime/trace.py). Each task answers with a
summary of its trace (`TraceSummary` of runtime/trace.py as JSON: window,
steps, time in collectives, waiting for input, compute) and, when files are
kept, its xplane.pb in parts. The capture ends when every task asked has
answered, or ANSWER_MARGIN_S after the traces should have ended: a task that
did not answer is named in `missing` with why. Its result, a `Capture`,
goes to the `on_done` callback given, and with `keep_files` to
`RUN_DIR/profiles/<id>/summary.json` beside the traces, laid out for
TensorBoard's profile plugin: `plugins/profile/<id>/<task>.xplane.pb`.

`mgpu-launch profile` (launcher/commands/profile.py) reaches a running launcher
through a request file, `RUN_DIR/profiles/request.json`, that `poll` looks
for on the supervisor's thread; everything here runs on that thread.

Must not import: supervisor, views, commands, cli.
"""

from __future__ import annotations

import base64
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...spec import rundir
from ..detect.generation import Generation
from ..record.states import TaskState

PROFILES = "profiles"  # RUN_DIR/profiles/
REQUEST = "request.json"  # RUN_DIR/profiles/request.json: `mgpu-launch profile`'s ask
# RUN_DIR/profiles/<id>/summary.json: the capture's result (named as the run's own)
SUMMARY = rundir.SUMMARY
# From the request to the traces' start, by each agent's clock: more than the
# spread of the request's arrival at the agents (milliseconds on a LAN) plus the
# tasks' look for it (runtime/trace.py, POLL_S 0.2 s).
DELAY_S = 0.5
# After the traces should have ended: stopping the profiler, writing and
# summarising the xplane.pb (a second or two on a loaded host), sending it.
ANSWER_MARGIN_S = 30.0
MAX_SECONDS = 60.0
TRACE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SUMMARY_FIELDS = ("window_s", "steps", "step_s", "collective_s", "input_s", "compute_s")


class Link(Protocol):
    """What a capture needs of an agent link (transport's `AgentLink`)."""

    def send(self, message: dict[str, Any]) -> bool: ...


def new_id(wall: float | None = None) -> str:
    """A capture's id: its UTC time, e.g. 20261126-183012."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if wall is None else wall))


def trace_file(folder: Path, ident: str, task: str) -> Path:
    """Where a task's trace goes: TensorBoard's profile plugin's layout."""
    return folder / "plugins" / "profile" / ident / f"{task}.xplane.pb"


@dataclass
class TaskTrace:
    """One task's answer: its host, its summary (SUMMARY_FIELDS), its file (relative
    to the capture's folder) and an error (empty: none)."""

    task: str
    host: str
    summary: dict[str, Any] | None = None
    file: str | None = None
    error: str = ""


@dataclass
class Capture:
    """One synchronized trace of a job: what each task answered, who did not."""

    ident: str
    seconds: float
    generation: int
    started: float  # wall time of the request
    folder: Path | None  # None: files not kept
    traces: dict[str, TaskTrace] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)  # task -> why no answer
    error: str = ""  # the capture as a whole could not run
    asked: dict[str, str] = field(default_factory=dict)  # task -> host, waiting
    deadline: float = 0.0
    on_done: Callable[[Capture], None] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.ident, "seconds": self.seconds, "generation": self.generation,
            "started": self.started, "error": self.error,
            "tasks": {name: {"host": t.host, "summary": t.summary, "file": t.file,
                             "error": t.error} for name, t in sorted(self.traces.items())},
            "missing": dict(sorted(self.missing.items())),
        }


class Profiler:
    """The job's traces; one capture at a time, driven by the supervisor's thread."""

    def __init__(self, run_dir: Path | None, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self._clock = clock
        self._wall = wall
        self.current: Capture | None = None

    def capture(self, gen: Generation, links: Mapping[str, Link], seconds: float, *,
                ident: str | None = None, keep_files: bool = True,
                on_done: Callable[[Capture], None] | None = None) -> Capture:
        """Ask every running task of `gen` to trace for `seconds`; returns the capture
        (done at once, with `error`, if another one runs or nothing can be traced)."""
        ident = ident if isinstance(ident, str) else new_id(self._wall())
        if not TRACE_ID.match(ident):  # never a path: it names a folder
            return self._finish(Capture(ident[:64], 0.0, gen.plan.generation, self._wall(),
                                        None, error=f"bad trace id {ident[:64]!r}",
                                        on_done=on_done))
        try:
            seconds = min(max(float(seconds), 0.1), MAX_SECONDS)
        except (TypeError, ValueError):
            seconds = 2.0
        folder = self._run_dir / PROFILES / ident if keep_files and self._run_dir else None
        capture = Capture(ident, seconds, gen.plan.generation, self._wall(), folder,
                          on_done=on_done)
        if self.current is not None:
            capture.error = f"trace {self.current.ident} is still running"
            return self._finish(capture)
        by_host: dict[str, list[str]] = {}
        for name, record in gen.records.items():
            if record.state is TaskState.RUNNING:
                by_host.setdefault(record.task.host, []).append(name)
            else:
                capture.missing[name] = f"not running ({record.state.name.lower()})"
        for host, names in sorted(by_host.items()):
            link = links.get(host)
            sent = link is not None and link.send({
                "op": "profile", "id": ident, "tasks": names, "seconds": seconds,
                "delay_s": DELAY_S, "send_file": folder is not None})
            for name in names:
                if sent:
                    capture.asked[name] = host
                else:
                    capture.missing[name] = f"the agent of {host} is not connected"
        if not capture.asked:
            capture.error = capture.error or "no task of the job is running"
            return self._finish(capture)
        if folder is not None:
            _private_dirs(trace_file(folder, ident, "x").parent)
        capture.deadline = self._clock() + DELAY_S + seconds + ANSWER_MARGIN_S
        self.current = capture
        return capture

    def poll(self, gen: Generation, links: Mapping[str, Link]) -> None:
        """Take a request of `mgpu-launch profile`; end a capture past its deadline,
        or once a task asked has stopped running (its answer will never come)."""
        capture = self.current
        if capture is not None:
            for name in list(capture.asked):
                record = gen.records.get(name)
                if gen.plan.generation != capture.generation:
                    capture.missing[name] = "the job restarted during the trace"
                elif record is None or record.state is not TaskState.RUNNING:
                    state = record.state.name.lower() if record is not None else "gone"
                    capture.missing[name] = f"it stopped running during the trace ({state})"
                elif self._clock() > capture.deadline:
                    capture.missing[name] = (f"no answer within {ANSWER_MARGIN_S:.0f} s of "
                                             "the trace's end")
                else:
                    continue
                del capture.asked[name]
            if not capture.asked:
                self._finish(capture)
        request = self._take_request()
        if request is not None:
            self.capture(gen, links, request.get("seconds", 2.0), ident=request.get("id"))

    def on_message(self, host: str, body: dict[str, Any]) -> None:
        """A `profile` or `profile_part` event from an agent (checked: job/run/protocol.py)."""
        capture = self.current
        name = body.get("task")
        if capture is None or body.get("id") != capture.ident or capture.asked.get(name) != host:
            return  # late, or not asked of this host
        if body["ev"] == "profile_part":
            self._write_part(capture, name, body)
            return
        trace = capture.traces.setdefault(name, TaskTrace(name, host))
        trace.summary = body.get("summary")
        trace.error = trace.error or body.get("error") or ""
        if not trace.summary and not trace.error:
            trace.error = "no summary"
        del capture.asked[name]
        if not capture.asked:
            self._finish(capture)

    def _write_part(self, capture: Capture, name: str, body: dict[str, Any]) -> None:
        trace = capture.traces.setdefault(name, TaskTrace(name, capture.asked[name]))
        if capture.folder is None or trace.error:
            return
        path = trace_file(capture.folder, capture.ident, name)
        try:
            data = base64.b64decode(body["data"], validate=True)
            size = path.stat().st_size if path.exists() else 0
            if body["offset"] != size:
                raise ValueError(f"a part at {body['offset']}, the file has {size} bytes")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "ab") as handle:
                handle.write(data)
            trace.file = str(path.relative_to(capture.folder))
        except (OSError, ValueError) as exc:
            trace.error = f"its trace file could not be written: {exc}"

    def _finish(self, capture: Capture) -> Capture:
        if self.current is capture:
            self.current = None
        if capture.folder is not None:
            _write_summary(capture)
        if capture.on_done is not None:
            capture.on_done(capture)
        return capture

    def _take_request(self) -> dict[str, Any] | None:
        if self._run_dir is None:
            return None
        path = self._run_dir / PROFILES / REQUEST
        try:
            text = path.read_text(encoding="utf-8")
            path.unlink()
            request = json.loads(text)
        except (OSError, ValueError):
            return None
        return request if isinstance(request, dict) else None


def _private_dirs(path: Path) -> None:
    """`path` and its missing parents, each 0700 (traces are the user's only)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def _write_summary(capture: Capture) -> None:
    assert capture.folder is not None
    try:
        _private_dirs(capture.folder)
        tmp = capture.folder / (SUMMARY + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(capture.to_json(), handle, indent=1)
        os.replace(tmp, capture.folder / SUMMARY)
    except OSError:
        pass  # the CLI waiting for it says that no answer came
