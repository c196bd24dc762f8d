"""Prometheus metrics of a running job (`--metrics-port`, `metrics:` in the
cluster file; docs/operations.md, "Metrics").

`JobMetrics` is a `Listener` of the story: told every event by the supervisor
thread, it folds them into the run's model (`launcher.job.record.story.Story`) under a
lock (held for microseconds: telling never waits on a scrape). It is also a
prometheus-client collector in a private `CollectorRegistry`: a scrape builds
every `mgpu_` family from that state at that moment (so "seconds since progress"
is always fresh). A rendering only: serving the text over HTTP and writing it
for node_exporter is launcher/outlets/metrics.py's.

Goodput parts and stragglers: the goodput parts are the story's ledger
(launcher/job/record/goodput.py), kept from the events told and worked out at each
scrape; `set_goodput(parts, wall_s, productive_s)` (any thread), or a `goodput`
event told like any other, puts given parts in its place. A `straggler` event
(kind and fields task, host, slowdown, evidence) is read from the story by its
kind.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..job.record import events as ev
from ..job.record.states import TaskState
from ..job.record.story import JOB_STATES, Story

TASK_LABELS = ("job", "task", "host")
TASK_STATES = tuple(s.value for s in TaskState)


class JobMetrics:
    """The job's metrics: told the story, scraped from another thread."""

    def __init__(self, job: str, clock=time.time) -> None:
        self.job = job
        self._clock = clock
        self._lock = threading.Lock()
        self._state = Story()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # ------------------------------------------------------------ feeding

    def tell(self, event: ev.Event) -> None:
        with self._lock:
            self._state.tell(event, self._clock())

    def set_goodput(self, parts: Mapping[str, float], wall_s: float | None = None,
                    productive_s: float | None = None) -> None:
        """The goodput ledger's parts in seconds (`goodput.parts` of summary.json),
        with its `wall_s` and `productive_s` when known."""
        with self._lock:
            self._state.set_goodput(parts, wall_s, productive_s)

    def text(self) -> str:
        """The Prometheus text exposition of every metric now."""
        return generate_latest(self.registry).decode()

    # ----------------------------------------------------------- scraping

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._job_families()
            yield from self._task_families()
            yield from self._health_families()

    def _job_families(self) -> Iterator[Metric]:
        state = self._state
        family = GaugeMetricFamily("mgpu_job_state", "The job's state: 1 for the current one",
                                   labels=["job", "state"])
        for name in JOB_STATES:
            family.add_metric([self.job, name], 1.0 if state.job_state == name else 0.0)
        yield family
        yield _one(GaugeMetricFamily("mgpu_job_generation", "The job's current generation "
                                     "(0 until its first restart)", labels=["job"]),
                   [self.job], state.generation)
        yield _one(CounterMetricFamily("mgpu_job_restarts", "Restarts of the whole job so far",
                                       labels=["job"]), [self.job], state.restarts)
        alone = CounterMetricFamily("mgpu_task_restarts_alone", "Failures of each "
                                    "ParameterServerStrategy worker that the job survived: "
                                    "the worker restarted alone", labels=list(TASK_LABELS))
        counts: dict[tuple[str, str], int] = {}
        for event in state.alone:
            counts[(event.task, event.host)] = counts.get((event.task, event.host), 0) + 1
        for (task, host), count in sorted(counts.items()):
            alone.add_metric([self.job, task, host], count)
        yield alone

    def _task_families(self) -> Iterator[Metric]:
        state = self._state
        now = self._clock()
        states = GaugeMetricFamily("mgpu_task_state", "Each task's state: 1 for the current one",
                                   labels=[*TASK_LABELS, "state"])
        step = GaugeMetricFamily("mgpu_task_step", "The last training step each task reported",
                                 labels=list(TASK_LABELS))
        rate = GaugeMetricFamily("mgpu_task_steps_per_second", "Each task's training steps per "
                                 "second, over its last two progress reports",
                                 labels=list(TASK_LABELS))
        silent = GaugeMetricFamily("mgpu_task_seconds_since_progress", "Seconds since each "
                                   "running task last reported progress (or started, "
                                   "before its first report)",
                                   labels=list(TASK_LABELS))
        for row in state.rows(now):
            labels = [self.job, row.task, row.host]
            for name in TASK_STATES:
                states.add_metric([*labels, name], 1.0 if row.state == name else 0.0)
            if row.step is not None:
                step.add_metric(labels, float(row.step))
            if row.steps_per_s is not None:
                rate.add_metric(labels, row.steps_per_s)
            if row.silent_s is not None:
                silent.add_metric(labels, row.silent_s)
        yield from (states, step, rate, silent)

    def _health_families(self) -> Iterator[Metric]:
        state = self._state
        ledger = state.goodput(self._clock()) or {}
        parts = GaugeMetricFamily("mgpu_goodput_seconds", "The job's wall time by goodput "
                                  "part (training, startup, recovery, ...)",
                                  labels=["job", "part"])
        for part, seconds in sorted((ledger.get("parts") or {}).items()):
            parts.add_metric([self.job, part], seconds)
        yield parts
        wall, productive = ledger.get("wall_s"), ledger.get("productive_s")
        if wall and productive is not None:
            yield _one(GaugeMetricFamily("mgpu_goodput_ratio", "Productive time over wall "
                                         "time", labels=["job"]), [self.job], productive / wall)
        slow = GaugeMetricFamily("mgpu_straggler_slowdown", "Tasks named stragglers in this "
                                 "generation: how many times slower than their peers",
                                 labels=list(TASK_LABELS))
        for straggler in state.stragglers.values():
            slow.add_metric([self.job, straggler.task, straggler.host],
                            straggler.slowdown if straggler.slowdown is not None else 1.0)
        yield slow
        yield _one(GaugeMetricFamily("mgpu_stragglers", "Tasks named stragglers in this "
                                     "generation", labels=["job"]),
                   [self.job], len(state.stragglers))
        yield _one(CounterMetricFamily("mgpu_straggler_reports", "Straggler reports so far",
                                       labels=["job"]), [self.job], len(state.straggler_events))
        bad = CounterMetricFamily("mgpu_nonfinite", "Losses (one per generation) and saves "
                                  "(the first of a generation) gone non-finite so far",
                                  labels=["job", "what"])
        for what, kind in (("loss", ev.Nonfinite), ("save", ev.NonfiniteSave)):
            bad.add_metric([self.job, what], sum(isinstance(e, kind) for e in state.nonfinite))
        yield bad
        yield _one(CounterMetricFamily("mgpu_loss_spikes", "Loss spikes so far: a step's loss "
                                       "far above its recent window (the sentinel's)",
                                       labels=["job"]), [self.job],
                   sum(isinstance(e, ev.LossSpike) for e in state.nonfinite))
        yield _one(CounterMetricFamily("mgpu_skipped_batches", "Bad batches skipped so far: "
                                       "the same step's loss gone non-finite twice (the "
                                       "sentinel's)", labels=["job"]), [self.job],
                   sum(isinstance(e, ev.BatchSkipped) for e in state.nonfinite))
        yield from self._resume_families()
        yield _one(CounterMetricFamily("mgpu_rollbacks", "Restarts of the job from the last "
                                       "save before a step whose loss went bad (the NaN "
                                       "sentinel's)", labels=["job"]), [self.job], state.rollbacks)


    def _resume_families(self) -> Iterator[Metric]:
        """Where the current generation resumed and the newest save, as `status`
        and summary.json say them (absent until known)."""
        state = self._state
        resumed = next((e.step for e in reversed(state.resumes)
                        if e.generation == state.generation), None)
        if resumed is not None:
            yield _one(GaugeMetricFamily("mgpu_resumed_step", "The step this generation "
                                         "resumed at (its restored checkpoint's)",
                                         labels=["job"]), [self.job], resumed)
        if state.history.saves:
            yield _one(GaugeMetricFamily("mgpu_last_saved_step", "The step of the newest "
                                         "completed save reported", labels=["job"]),
                       [self.job], state.history.saves[-1].step)


def _one(family: GaugeMetricFamily | CounterMetricFamily, labels: list[str],
         value: float) -> Metric:
    family.add_metric(labels, float(value))
    return family
