"""The straggler radar on the supervisor's side: each generation's synchronous
tasks watched through their host signals (and traces, when taken), a
`straggler` event told once a task is named (docs/stragglers.md), and the
`health` samples written to events.jsonl at a bounded rate.

The judgement is stragglers.py's (pure); this module feeds it from the
supervisor thread and keeps what summary.json says (`stragglers`).

With `restart.on_straggler: replace`, a named straggler's host is set aside
at the job's next checkpoint (a save the runtime reports, or the checkpoint
series moving on disk) while a spare host is idle: the generation fails with
kind `straggler` (a `Found` returned to the supervisor's loop, which acts on
it: job/detect/findings.py), and the restart puts the spare in its place
(recovery.choose_hosts, as for a lost host), saying so (`hosts_chosen`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ...strategy import COLLECTIVE
from ..record import events as ev
from ..record.failkinds import Kind
from ..record.reports import ProgressReport
from ..record.states import TaskRecord
from . import checkpoints
from .findings import Found
from .generation import Generation
from .stragglers import Detector, Finding

# Traces (job/run/profiling.py): one of TRACE_SECONDS of every task at these
# seconds of training, then one every TRACE_EVERY_S: rare enough that their
# cost stays within noise, and two agreeing traces name a straggler. Only with
# MGPU_STRAGGLER_TRACES=1 in the launcher's environment: a worker pinned to a
# contended core died of "free(): invalid size" as its in-process trace ended
# (twice in a row here, TF 2.21), so no job is traced unasked.
TRACES_ENV = "MGPU_STRAGGLER_TRACES"
TRACE_AT_S = (12.0, 24.0)
TRACE_EVERY_S = 300.0
TRACE_SECONDS = 1.0
# A task's health sample is written to events.jsonl at most this often (the
# radar itself hears every one, every 3 s): 64 tasks, a week: ~125 MB (operations.md).
HEALTH_RECORD_EVERY_S = 60.0
SYNCHRONOUS_ROLES = ("chief", "worker")


class Radar:
    def __init__(self, tell: Callable[[ev.Event], None], clock: Callable[[], float],
                 on_straggler: str = "warn", *, spares: tuple[str, ...] = (),
                 probe: Callable[[], checkpoints.State | None] = lambda: None,
                 profiler: Any = None, alive: Callable[[str], bool] = lambda host: True) -> None:
        self._tell = tell
        self._clock = clock
        self.on_straggler = on_straggler
        self._spares = spares  # hosts marked spare: true
        self._alive = alive  # whether a host's agent link is open
        self._probe = probe  # the checkpoint series on disk (checkpoints.checkpoint_state)
        self._replace: tuple[Finding, checkpoints.State | None] | None = None
        # The highest step reported in this generation, and where it was when the
        # straggler was named: only a save past it is "the next checkpoint".
        self._top, self._named_at = 0, 0
        # job/run/profiling.py's Profiler: synchronized traces (opt-in, TRACES_ENV)
        self._profiler = profiler if os.environ.get(TRACES_ENV, "") == "1" else None
        self._traces: list[float] = []  # seconds of training at each trace taken
        self._generation: int | None = None
        self._detector: Detector | None = None
        self._recorded: dict[str, float] = {}  # task -> when its health was last written
        self.named: list[dict[str, Any]] = []  # for summary.json

    def _for(self, gen: Generation) -> Detector | None:
        if gen.plan.generation != self._generation:
            self._generation = gen.plan.generation
            self._recorded = {}
            self._replace = None
            self._traces = []
            self._top = self._named_at = 0
            hosts = {t.name: t.host for t in gen.plan.tasks if t.role in SYNCHRONOUS_ROLES}
            synchronous = gen.plan.strategy in COLLECTIVE and len(hosts) >= 2
            self._detector = Detector(hosts) if synchronous else None
        return self._detector

    def heartbeat(self, gen: Generation, record: TaskRecord, usage: dict[str, Any],
                  t: Any) -> Found | None:
        """A heartbeat's entry for `record`; its `health`, when it has one. A
        straggler to set aside now (its checkpoint came) is returned."""
        figures = usage.get("health")
        if not figures or not isinstance(t, int | float):
            return None
        now = self._clock()
        name = record.task.name
        if now - self._recorded.get(name, -HEALTH_RECORD_EVERY_S) >= HEALTH_RECORD_EVERY_S:
            self._recorded[name] = now
            self._tell(ev.Health(generation=gen.plan.generation, task=name,
                                 host=record.task.host, figures=dict(figures)))
        detector = self._for(gen)
        if detector is not None:
            self._found(gen, detector.health(now, name, float(t), figures))
        if self._replace is not None and checkpoints.advanced(self._replace[1], self._probe()):
            return self._set_aside(gen)
        return None

    def progress(self, gen: Generation, data: dict[str, Any]) -> Found | None:
        detector, report = self._for(gen), ProgressReport.read(data)
        if detector is not None and report.step is not None:
            detector.progress(self._clock(), report.step)
        saved_at = report.saved if report.saved is not None else report.step
        if report.step is not None:
            self._top = max(self._top, report.step)
        if self._replace is not None and (saved_at is None or saved_at > self._named_at) and (
                report.checkpoint or (report.save_s and checkpoints.advanced(
                    self._replace[1], self._probe()))):
            # A save reported (a slow task's report of a save before the naming is
            # not the next one), or one timed and seen on disk.
            return self._set_aside(gen)
        return None

    def tick(self, gen: Generation, links: Any) -> None:
        """From the supervisor's loop: trace every task when a trace is due."""
        detector = self._for(gen)
        if detector is None or self._profiler is None or self._profiler.current is not None:
            return
        trained = detector.trained_s(self._clock())
        taken = len(self._traces)
        due = TRACE_AT_S[taken] if taken < len(TRACE_AT_S) else \
            self._traces[-1] + TRACE_EVERY_S
        if trained is None or trained < due:
            return
        self._traces.append(trained)
        generation = gen.plan.generation
        self._profiler.capture(gen, links, TRACE_SECONDS, keep_files=False,
                               ident=f"radar-g{generation}-{taken + 1}",
                               on_done=lambda capture: self._traced(gen, capture))

    def _traced(self, gen: Generation, capture: Any) -> None:
        """A trace's answers: each task's time per step, in ms, to the judgement."""
        if gen.plan.generation != self._generation or self._detector is None:
            return
        summaries = {}
        for name, trace in capture.traces.items():
            per_step = per_step_ms(trace.summary or {})
            if per_step:
                summaries[name] = per_step
        self._found(gen, self._detector.trace(self._clock(), summaries))

    def _set_aside(self, gen: Generation) -> Found | None:
        """The checkpoint came: the generation fails so that a spare takes the slow host's place."""
        assert self._replace is not None
        finding, self._replace = self._replace[0], None
        record = gen.records.get(finding.task)
        if record is None or gen.failure is not None or not self._idle_spare(gen):
            return None  # no idle spare left (or already failing): named, not replaced
        gen.set_aside.add(finding.host)  # the restart chooses a spare instead
        return Found(record, Kind.STRAGGLER, "replaced", {"slowdown": finding.slowdown})

    def _idle_spare(self, gen: Generation) -> str:
        """The spare the restart would choose (recovery.choose_hosts: the first
        in the file's order not in use); "" when none is idle. A spare whose
        agent is gone is none: the restart would wait for it, then give up."""
        in_use = {t.host for t in gen.plan.tasks}
        return next((s for s in self._spares if s not in in_use and self._alive(s)), "")

    def trace(self, gen: Generation, summaries: dict[str, dict[str, float]]) -> None:
        """One synchronized trace's per-task summary (the profile library)."""
        detector = self._for(gen)
        if detector is not None:
            self._found(gen, detector.trace(self._clock(), summaries))

    def _found(self, gen: Generation, finding: Finding | None) -> None:
        if finding is None:
            return
        event = ev.Straggler(generation=gen.plan.generation, task=finding.task,
                             host=finding.host, slowdown=finding.slowdown,
                             evidence=finding.evidence, source=finding.source,
                             samples=finding.samples, action=self.on_straggler,
                             spare=self._idle_spare(gen) if self.on_straggler == "replace"
                             else None)
        self.named.append({"generation": event.generation, "task": event.task,
                           "host": event.host, "slowdown": event.slowdown,
                           "evidence": event.evidence, "source": event.source,
                           "action": event.action})
        self._tell(event)
        if self.on_straggler == "replace":
            self._replace, self._named_at = (finding, self._probe()), self._top


def per_step_ms(summary: dict[str, Any]) -> dict[str, float]:
    """A trace summary's totals (runtime/xplane.py: `window_s`, `steps`,
    `collective_s`, `input_s`, `compute_s`) as milliseconds per step."""
    steps = summary.get("steps")
    window = summary.get("window_s")
    if not isinstance(steps, int | float) or steps <= 0 or not isinstance(window, int | float):
        return {}
    out = {"step_ms": 1000.0 * window / steps}
    for key in ("collective", "input", "compute"):
        value = summary.get(f"{key}_s")
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[f"{key}_ms"] = 1000.0 * value / steps
    return out if "collective_ms" in out else {}
