"""The straggler radar's judgement: which task of a synchronous job is slower
than its peers, by how much, and where its time goes (docs/stragglers.md).

In synchronous data parallelism every task's step rate is the same: a slow
task makes its peers wait for it inside the collective. So the radar never
compares step rates; it compares what each task does with its time:

- host signals (launcher/agent/health.py, every few seconds): the time its
  threads waited for a CPU (scheduler run delay), were held by a cgroup
  quota or were blocked reading input (or sleeping in it), against the CPU
  time they got; on GPU hosts the SM clock against its
  peers'. `slowdown` = (its CPU time + its waiting) / (its CPU time + its
  peers' waiting): how much longer its own work took than it would have with
  its peers' waiting; for a GPU, the peers' clock over its own;
- a trace's per-task split of a step (collective, input, compute; the
  profile library): the slow task spends the least time in collectives.
  `slowdown` = its own time per step (step - collective) / its peers'.

No false alarms: nothing is judged before `warmup_s` of training, a round is
judged only when steps advanced at no less than half the recent rate (a
checkpoint save, an evaluation or an epoch end pauses the steps: that round
does not count, and a pause longer than MAX_WINDOW_S starts the agreement
again), and a task is named only after `agree` judged rounds in a row
(`trace_agree` traces) named it, each by a clear margin. A task is named once.

Pure: no clock, no I/O; the radar (radar.py) feeds it and tells the findings.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

WARMUP_S = 8.0  # training before any judgement: the first steps build graphs, warm caches
AGREE = 4  # rounds of host signals in a row (a round: every task sampled once, ~3 s)
TRACE_AGREE = 2  # traces in a row
MIN_SLOWDOWN = 1.5
MIN_WAIT_EXCESS = 0.15  # seconds of waiting per second beyond the peers' (a floor for noise)
MIN_GPU_CLOCK_RATIO = 1.15
STEADY_RATE_SHARE = 0.5
MAX_WINDOW_S = 30.0  # a longer gap between two samples of a task is no window


@dataclass(frozen=True)
class Finding:
    task: str
    host: str
    slowdown: float
    evidence: dict[str, Any]
    source: str  # host | gpu | trace
    samples: int  # the rounds (or traces) that agreed


@dataclass
class _Window:
    cpu: float  # seconds per second
    wait: float  # run delay + throttling + input waits, seconds per second
    delay: float
    throttled: float
    io: float = 0.0  # busy threads blocked reading or sleeping, on average
    gpu: dict[str, float] = field(default_factory=dict)


@dataclass
class _Streak:
    task: str | None = None
    rounds: list[tuple[float, dict[str, Any], str]] = field(default_factory=list)

    def add(self, task: str | None, slowdown: float, evidence: dict[str, Any],
            source: str) -> int:
        if task is None or task != self.task:
            self.task, self.rounds = task, []
        if task is not None:
            self.rounds.append((slowdown, evidence, source))
        return len(self.rounds)


class Detector:
    """One generation's radar: fed samples, returns a finding when one is due."""

    def __init__(self, hosts: Mapping[str, str], *, warmup_s: float = WARMUP_S,
                 agree: int = AGREE, trace_agree: int = TRACE_AGREE) -> None:
        self.hosts = dict(hosts)  # task -> host, the synchronous tasks only
        self.warmup_s = warmup_s
        self.agree = agree
        self.trace_agree = trace_agree
        self.named: set[str] = set()
        self._last: dict[str, tuple[float, dict[str, float]]] = {}
        self._windows: dict[str, _Window] = {}
        self._first_step_t: float | None = None
        self._step: tuple[float, int] | None = None  # the latest (time, job step)
        self._round_mark: tuple[float, int] | None = None  # at the previous round
        self._rates: list[float] = []  # steady rounds' step rates, recent
        self._last_windows: dict[str, _Window] = {}  # the last steady round's, for evidence
        self._counted_t = float("-inf")  # when the last steady round was judged
        self._host_streak = _Streak()
        self._trace_streak = _Streak()

    # ------------------------------------------------------------ inputs

    def progress(self, now: float, step: int) -> None:
        """The job's step count moved (the highest any task reported)."""
        if step <= 0:
            return
        if self._first_step_t is None:
            self._first_step_t = now
        if self._step is None or step > self._step[1]:
            self._step = (now, step)

    def health(self, now: float, task: str, t: float, figures: Mapping[str, float]) -> \
            Finding | None:
        """One task's cumulative host signals at its agent's time `t`."""
        if task not in self.hosts:
            return None
        previous = self._last.get(task)
        self._last[task] = (t, dict(figures))
        if previous is None or not 0 < t - previous[0] <= MAX_WINDOW_S:
            return None
        span = t - previous[0]
        rate = {key: max(0.0, figures.get(key, 0.0) - previous[1].get(key, 0.0)) / span
                for key in ("cpu_s", "run_delay_s", "throttled_s")}
        gpu = {k: v for k, v in figures.items() if k in ("gpu_util", "sm_clock_mhz",
                                                         "sm_clock_max_mhz")}
        io = max(0.0, float(figures.get("io_wait", 0.0)))  # a gauge, not a counter
        self._windows[task] = _Window(cpu=rate["cpu_s"], delay=rate["run_delay_s"],
                                      throttled=rate["throttled_s"], io=io,
                                      wait=rate["run_delay_s"] + rate["throttled_s"] + io,
                                      gpu=gpu)
        if len(self._windows) < len(self.hosts):
            return None
        return self._round(now)

    def trace(self, now: float, summaries: Mapping[str, Mapping[str, float]]) -> Finding | None:
        """One synchronized trace: per task `step_ms`, `collective_ms` and, when
        known, `input_ms`, `compute_ms` (per step)."""
        per_task = {t: s for t, s in summaries.items() if t in self.hosts
                    and _num(s.get("step_ms")) and _num(s.get("collective_ms")) is not None}
        moving = self._step is not None and now - self._step[0] <= MAX_WINDOW_S / 3
        if len(per_task) < 2 or not self._warm(now) or not moving:
            self._trace_streak.add(None, 0.0, {}, "trace")
            return None
        own = {t: max(0.0, s["step_ms"] - s["collective_ms"]) for t, s in per_task.items()}
        task = max(own, key=lambda t: own[t])
        peers = [own[t] for t in own if t != task]
        base = statistics.median(peers)
        slowdown = own[task] / base if base > 0 else float("inf")
        coll_peers = statistics.median(per_task[t]["collective_ms"] for t in peers_of(own, task))
        clear = slowdown >= MIN_SLOWDOWN and per_task[task]["collective_ms"] < coll_peers
        evidence = _trace_evidence(task, per_task)
        if task in self._last_windows:  # what the host says of the same task, beside it
            host = _host_evidence(self._last_windows[task],
                                  [w for t, w in self._last_windows.items() if t != task],
                                  self.step_rate())
            if host["unit"] == evidence["unit"]:
                evidence = {"unit": evidence["unit"], "task": {**evidence["task"], **host["task"]},
                            "peers": {**evidence["peers"], **host["peers"]}}
        agreed = self._trace_streak.add(task if clear else None, min(slowdown, 99.0),
                                        evidence, "trace")
        return self._maybe_name(self._trace_streak, agreed, self.trace_agree)

    # ---------------------------------------------------------- judgement

    def _warm(self, now: float) -> bool:
        return self._first_step_t is not None and self._step is not None \
            and now - self._first_step_t >= self.warmup_s

    def _steady(self, now: float) -> bool:
        """Training has run past its warm-up and the steps advanced this round
        at no less than half the recent rate."""
        mark, self._round_mark = self._round_mark, self._step
        if not self._warm(now) or mark is None or self._step is None \
                or self._step[0] <= mark[0]:
            return False
        rate = (self._step[1] - mark[1]) / (self._step[0] - mark[0])
        recent = statistics.median(self._rates) if self._rates else 0.0
        self._rates = [*self._rates[-11:], rate]
        return rate > 0 and rate >= STEADY_RATE_SHARE * recent

    def trained_s(self, now: float) -> float | None:
        """Seconds since training began, while the steps move (None: not training)."""
        if self._first_step_t is None or self._step is None \
                or now - self._step[0] > MAX_WINDOW_S / 3:
            return None
        return now - self._first_step_t

    def step_rate(self) -> float | None:
        return statistics.median(self._rates) if self._rates else None

    def _round(self, now: float) -> Finding | None:
        windows, self._windows = self._windows, {}
        if not self._steady(now):
            return None  # a pause (a save, an evaluation, an epoch end): this round does not count
        if now - self._counted_t > MAX_WINDOW_S:  # a long pause: agreement starts again
            self._host_streak.add(None, 0, {}, "host")
        self._counted_t = now
        self._last_windows = windows
        task, slowdown, evidence, source = _candidate(windows, self.step_rate())
        agreed = self._host_streak.add(task, slowdown, evidence, source)
        return self._maybe_name(self._host_streak, agreed, self.agree)

    def _maybe_name(self, streak: _Streak, agreed: int, needed: int) -> Finding | None:
        task = streak.task
        if task is None or agreed < needed or task in self.named:
            return None
        self.named.add(task)
        slowdown = statistics.median(r[0] for r in streak.rounds)
        evidence = _mean_evidence([r[1] for r in streak.rounds])
        return Finding(task=task, host=self.hosts[task], slowdown=round(slowdown, 2),
                       evidence=evidence, source=streak.rounds[-1][2], samples=agreed)


def peers_of(values: Mapping[str, Any], task: str) -> list[str]:
    return [t for t in values if t != task]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


def _candidate(windows: Mapping[str, _Window], rate: float | None) -> \
        tuple[str | None, float, dict[str, Any], str]:
    """The round's clear outlier, if any: (task, slowdown, evidence, source)."""
    best: tuple[str | None, float, dict[str, Any], str] = (None, 0.0, {}, "host")
    for task, own in windows.items():
        peers = [windows[t] for t in peers_of(windows, task)]
        if not peers:
            continue
        wait_peers = statistics.median(p.wait for p in peers)
        slowdown = (own.cpu + own.wait) / max(own.cpu + wait_peers, 1e-6)
        if own.wait - wait_peers >= MIN_WAIT_EXCESS and slowdown >= MIN_SLOWDOWN \
                and slowdown > best[1]:
            best = (task, slowdown, _host_evidence(own, peers, rate), "host")
        clock_ratio = _gpu_ratio(own, peers)
        if clock_ratio >= MIN_GPU_CLOCK_RATIO and clock_ratio > best[1]:
            best = (task, clock_ratio, _host_evidence(own, peers, rate), "gpu")
    return best


def _gpu_ratio(own: _Window, peers: list[_Window]) -> float:
    clocks = [p.gpu["sm_clock_mhz"] for p in peers if p.gpu.get("sm_clock_mhz")]
    mine = own.gpu.get("sm_clock_mhz")
    if not clocks or not mine or own.gpu.get("gpu_util", 0.0) < 50.0:
        return 0.0
    return statistics.median(clocks) / mine


def _host_evidence(own: _Window, peers: list[_Window], rate: float | None) -> dict[str, Any]:
    """Per step (per second when the step rate is unknown), in ms: its figures and its peers'."""
    scale = 1000.0 / rate if rate else 1000.0
    unit = "ms_per_step" if rate else "ms_per_s"

    def figures(w: _Window | None, ws: list[_Window]) -> dict[str, float]:
        pick = (lambda f: f(w)) if w is not None else \
            (lambda f: statistics.median(f(x) for x in ws))
        out = {"cpu": pick(lambda x: x.cpu) * scale,
               "waiting_for_cpu": pick(lambda x: x.delay) * scale,
               "throttled": pick(lambda x: x.throttled) * scale,
               "waiting_for_io": pick(lambda x: x.io) * scale}
        gpu = [x for x in ([w] if w is not None else ws) if x.gpu]
        for key in ("gpu_util", "sm_clock_mhz", "sm_clock_max_mhz"):
            values = [x.gpu[key] for x in gpu if key in x.gpu]
            if values:
                out[key] = statistics.median(values)
        return out

    return {"unit": unit, "task": figures(own, []), "peers": figures(None, peers)}


def _trace_evidence(task: str, per_task: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    keys = ("step_ms", "collective_ms", "input_ms", "compute_ms")
    peers = peers_of(per_task, task)

    def pick(names: list[str]) -> dict[str, float]:
        return {k: statistics.median(float(per_task[n][k]) for n in names)
                for k in keys if all(_num(per_task[n].get(k)) is not None for n in names)}

    return {"unit": "ms_per_step", "task": pick([task]), "peers": pick(peers)}


def _mean_evidence(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The agreeing rounds' evidence averaged, figures rounded to 0.1."""
    last = rounds[-1]
    out: dict[str, Any] = {"unit": last.get("unit")}
    for side in ("task", "peers"):
        keys = last.get(side, {}).keys()
        out[side] = {k: round(statistics.fmean(r[side][k] for r in rounds if k in r.get(side, {})),
                              1) for k in keys}
    return out


def describe(evidence: Mapping[str, Any]) -> str:
    """The evidence in words: where the task's time goes against its peers'."""
    unit = "ms/step" if evidence.get("unit") == "ms_per_step" else "ms/s"
    own, peers = evidence.get("task") or {}, evidence.get("peers") or {}
    words = {"waiting_for_cpu": "waiting for a CPU", "throttled": "throttled by its cgroup",
             "waiting_for_io": "waiting for input (reads, sleeps)", "cpu": "on CPU",
             "input_ms": "waiting for input", "collective_ms": "in collectives",
             "compute_ms": "computing", "sm_clock_mhz": "SM clock", "gpu_util": "GPU busy"}
    parts = []
    for key, label in words.items():
        if key in own and key in peers and (own[key] or peers[key]):
            suffix = " MHz" if key == "sm_clock_mhz" else " %" if key == "gpu_util" else \
                f" {unit}"
            parts.append(f"{label} {own[key]:.0f}{suffix} (peers {peers[key]:.0f})")
    return ", ".join(parts)
