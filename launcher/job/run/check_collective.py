"""The collective part of `mgpu-launch check`: a seconds-long mini job on the job's own plan.

Every task of the plan (generation 0: the job's TF_CONFIG addresses and ports,
its environment, its working directory) is started through the same agents
and bootstrap as a run, with `launcher.runtime.probe_collective` in place of
the training script (parameter_server: the chief runs the probe, the workers
and ps their usual servers). Each probe reports `joining`/`joined` and its
result as progress records. Owns the verdict per task and the bound: a task
that fails ends the mini job at once (it is the cause, the others are
stopped), and when `timeout_s` runs out the tasks still missing are named,
with what they did last; it never hangs.

Talks to the agents directly (start, stop): must not import the supervisor.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...spec.plan import SERVER_COMMAND, Plan, Task
from ...strategy import Strategy
from ...transport import AgentLink, AgentMessage

PROBE_MODULE = "launcher.runtime.probe_collective"
DEFAULT_TIMEOUT_S = 60.0  # TensorFlow start-up (~3-10 s), joining, two steps: seconds
STOP_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this
STOP_WAIT_S = 5.0  # for the stopped tasks' exits (their ports free again)
TAIL_LINES = 12

# Strategies whose tasks can try a collective, and what the probe does there.
WHAT = {
    Strategy.MULTI_WORKER_MIRRORED: "all-reduce under MultiWorkerMirroredStrategy",
    Strategy.KERAS_DISTRIBUTION: "JAX cross-process all-gather (Keras 3 on JAX)",
    Strategy.PARAMETER_SERVER: "ParameterServerStrategy: the chief connects to every worker "
                               "and ps, steps on the workers update a variable on a ps",
}


def skip_reason(plan: Plan) -> str | None:
    """Why no collective is tried for this plan (None: one is)."""
    if plan.strategy == Strategy.LEGACY_SERVER:
        return ("strategy legacy_server: TF1 graph code has no collective to try; the TCP "
                "reachability of every TF_CONFIG address above is the check")
    if plan.strategy not in WHAT:
        return f"strategy {plan.strategy}: no collective probe"
    members = [t for t in plan.tasks if t.role in ("chief", "worker")]
    if plan.strategy != Strategy.PARAMETER_SERVER and len(members) < 2:
        return "one worker: nothing to reduce across"
    return None


def task_addresses(plan: Plan) -> dict[str, str]:
    """`host0/worker0` -> `10.0.0.1:23456`: the address each task serves on, as
    its peers reach it: the plan's TF_CONFIG cluster spec. (The one place that
    says where a task's TF address comes from.)"""
    cluster: Mapping[str, Any] = {}
    for task in plan.tasks:
        cluster = task.tf_config.get("cluster", {})
        break
    by_name = {}
    for task in plan.tasks:
        members = cluster.get(task.role, ())
        if task.index < len(members):
            by_name[task.label] = str(members[task.index])
    return by_name


@dataclass
class TaskProbe:
    """One task of the mini job, as the agents report it."""

    task: Task
    address: str | None
    started_t: float | None = None
    cluster: str = ""  # "", "joining", "joined"
    result: dict[str, Any] | None = None  # the probe's record
    exit: dict[str, Any] | None = None  # the `exited` event
    error: str = ""  # start failure, lost host, or what it died of
    stopped: bool = False  # the check stopped it (after a failure, or at the deadline)
    timed_out: bool = False  # still without a result at the deadline
    tail: list[str] = field(default_factory=list)
    last_words: str = ""  # what it said last before it was stopped
    finished_t: float | None = None

    @property
    def runs_probe(self) -> bool:
        return self.task.command != SERVER_COMMAND

    @property
    def succeeded(self) -> bool:
        return bool(self.result and self.result.get("ok"))

    @property
    def failed(self) -> bool:
        return bool(self.error) or (self.result is not None and not self.result.get("ok"))


@dataclass
class CollectiveReport:
    """What the mini job found; `problems` are (host, text) for the verdict."""

    strategy: str
    what: str
    skipped: str | None = None
    probes: list[TaskProbe] = field(default_factory=list)
    cause: str = ""  # the first failure, or who was missing at the deadline
    wall_s: float = 0.0
    problems: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.skipped is None and not self.problems


def probe_argv(task: Task) -> list[str]:
    """The servers of a parameter_server job run as they would; the rest run the probe."""
    if task.command == SERVER_COMMAND:
        return list(task.argv)
    return [task.python, "-m", PROBE_MODULE]


def run_collective(links: Mapping[str, AgentLink], events: queue.Queue[AgentMessage],
                   plan: Plan, timeout_s: float = DEFAULT_TIMEOUT_S,
                   clock: Callable[[], float] = time.monotonic) -> CollectiveReport:
    """Start the mini job on `plan`, wait for every probe's result (bounded), stop it."""
    report = CollectiveReport(plan.strategy, WHAT.get(plan.strategy, ""))
    report.skipped = skip_reason(plan)
    if report.skipped:
        return report
    addresses = task_addresses(plan)
    # The evaluator serves no port and takes no part in training steps.
    tasks = [t for t in plan.tasks if t.role in ("chief", "worker", "ps")]
    missing_hosts = sorted({t.host for t in tasks if t.host not in links})
    if missing_hosts:
        report.skipped = f"not every host could be reached ({', '.join(missing_hosts)})"
        return report
    probes = {(t.host, t.name): TaskProbe(t, addresses.get(t.label)) for t in tasks}
    report.probes = list(probes.values())
    began = clock()
    # Each collective must fail before the launcher's deadline, so its error is seen.
    step_bound = f"{max(5.0, timeout_s / 3):g}"
    for probe in report.probes:
        task = probe.task
        env = {**task.env, "MGPU_PROBE_COLLECTIVE_TIMEOUT_S": step_bound}
        sent = links[task.host].send({
            "op": "start", "task": task.name, "generation": plan.generation,
            "argv": probe_argv(task), "cwd": task.cwd, "env": env,
            "tf_config": task.tf_config_json()})
        if not sent:
            probe.error = "the connection to its host's agent is closed"
    deadline = began + timeout_s
    _watch(probes, events, deadline, clock)
    report.wall_s = clock() - began
    if not any(p.failed for p in report.probes):
        for probe in report.probes:
            probe.timed_out = probe.runs_probe and not probe.succeeded
    _stop(links, probes, events, clock)
    _judge(report, timeout_s)
    return report


def _watch(probes: dict[tuple[str, str], TaskProbe], events: queue.Queue[AgentMessage],
           deadline: float, clock: Callable[[], float]) -> None:
    """Until every probe succeeded, one failed, or the deadline."""
    def done() -> bool:
        runners = [p for p in probes.values() if p.runs_probe]
        return (any(p.failed for p in probes.values())
                or all(p.succeeded for p in runners))

    while not done() and clock() < deadline:
        try:
            message = events.get(timeout=min(0.2, max(0.01, deadline - clock())))
        except queue.Empty:
            continue
        _take(probes, message, clock)


def _take(probes: dict[tuple[str, str], TaskProbe], message: AgentMessage,
          clock: Callable[[], float]) -> None:
    body, event = message.message, message.event
    if event == "agent_lost":
        for probe in probes.values():
            if probe.task.host == message.host and probe.exit is None:
                probe.error = probe.error or "its host's agent was lost (connection closed)"
                probe.finished_t = probe.finished_t or clock()
        return
    probe = probes.get((message.host, str(body.get("task"))))
    if probe is None:
        return
    if event == "started":
        probe.started_t = clock()
    elif event == "start_failed":
        probe.error = f"could not start: {body.get('error')}"
        probe.finished_t = clock()
        if "No such file or directory" in str(body.get("error")):
            probe.error += f" (its working directory {probe.task.cwd}? set `workdir:`)"
    elif event == "output":
        probe.tail = [*probe.tail[-(TAIL_LINES - 1):], str(body.get("text", ""))]
    elif event == "progress":
        data = body.get("data") or {}
        if data.get("cluster") in ("joining", "joined"):
            probe.cluster = data["cluster"]
        if isinstance(data.get("probe"), dict):
            probe.result = data["probe"]
            probe.finished_t = clock()
    elif event == "exited":
        probe.exit = body
        probe.finished_t = probe.finished_t or clock()
        if not probe.stopped and not probe.succeeded and not body.get("stopping"):
            probe.error = probe.error or _death(probe, body)


def _death(probe: TaskProbe, exited: dict[str, Any]) -> str:
    """What a task that ended on its own died of, in one line."""
    if probe.result and probe.result.get("error"):
        return str(probe.result["error"])
    error = exited.get("error") or {}
    if error.get("type"):
        return f"{error['type']}: {' '.join(str(error.get('message', '')).split())[:400]}"
    how = (f"killed by signal {exited['signal']}" if exited.get("signal")
           else f"exit code {exited.get('code')}")
    last = _telling_line(probe.tail or list(exited.get("tail") or []))
    return f"{how}" + (f"; last said: {last}" if last else "")


def _telling_line(lines: list[str]) -> str:
    """The last line that says something (not TensorFlow's start-up chatter)."""
    chatter = ("cuInit", "cuda drivers", "absl::InitializeLog", "oneDNN", "cpu_feature_guard",
               "rebuild TensorFlow", "SIGTERM caught")
    for line in reversed(lines):
        text = line.strip()
        if text and not any(c in text for c in chatter):
            return text[:300]
    return ""


def _stop(links: Mapping[str, AgentLink], probes: dict[tuple[str, str], TaskProbe],
          events: queue.Queue[AgentMessage], clock: Callable[[], float]) -> None:
    """Stop what still runs and wait (bounded) for the exits: the ports are free after."""
    running: dict[str, list[str]] = {}
    for probe in probes.values():
        if probe.started_t is not None and probe.exit is None:
            probe.stopped = True
            probe.last_words = _telling_line(probe.tail)
            running.setdefault(probe.task.host, []).append(probe.task.name)
    for host, names in running.items():
        links[host].send({"op": "stop", "tasks": names, "grace_s": STOP_GRACE_S})
    deadline = clock() + STOP_GRACE_S + STOP_WAIT_S
    while any(p.stopped and p.exit is None for p in probes.values()) and clock() < deadline:
        try:
            _take(probes, events.get(timeout=0.2), clock)
        except queue.Empty:
            continue


def _stage(probe: TaskProbe) -> str:
    """How far a task got, for one that did not finish."""
    if probe.started_t is None:
        return "never started"
    if probe.cluster == "joined":
        return "joined, but its collective did not finish"
    if probe.cluster == "joining":
        return "did not join the cluster (waiting for its peers)"
    if probe.runs_probe:
        return "did not reach the cluster (still starting TensorFlow?)"
    return "serving"


def _judge(report: CollectiveReport, timeout_s: float) -> None:
    """The cause in one line, and one problem per task to blame."""
    failed = [p for p in report.probes if p.failed]
    failed.sort(key=lambda p: p.finished_t if p.finished_t is not None else float("inf"))
    if failed:
        first = failed[0]
        report.cause = f"{first.task.label} failed: {first.error or first.result.get('error')}"
        for probe in failed:
            report.problems.append((probe.task.host, _blame(probe)))
        return
    missing = [p for p in report.probes if p.timed_out]
    if not missing:
        return
    # Those still starting (or never joining) are why the others wait for them.
    stuck = [p for p in missing if p.cluster != "joining"] or missing
    stages = {_stage(p) for p in stuck}
    report.cause = (f"no result within {timeout_s:g} s: {', '.join(p.task.label for p in stuck)} "
                    f"{stages.pop() if len(stages) == 1 else 'did not finish'}; can every host "
                    "reach the others' TF_CONFIG addresses? (`--collective-timeout S` if "
                    "TensorFlow starts slowly there)")
    for probe in stuck:
        last = probe.last_words or _telling_line(probe.tail)
        report.problems.append((probe.task.host, (
            f"collective: {probe.task.name} ({probe.address}) {_stage(probe)} within "
            f"{timeout_s:g} s" + (f"; its last line: {last}" if last else ""))))


def _blame(probe: TaskProbe) -> str:
    error = probe.error or str((probe.result or {}).get("error"))
    where = f" ({probe.address})" if probe.address else ""
    return f"collective: {probe.task.name}{where} failed: {error}"


def render(report: CollectiveReport) -> list[str]:
    """One line per task (result, time taken), then the outcome."""
    if report.skipped:
        return [f"collective: skipped - {report.skipped}"]
    lines = [f"collective ({report.what}):"]
    rows = []
    for probe in report.probes:
        rows.append([probe.task.label, probe.address or "-", *_cells(probe)])
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True))
                     + "  " + row[3])
    if report.ok:
        lines.append(f"collective: ok in {report.wall_s:.1f} s")
    else:
        lines.append(f"collective: FAILED - {report.cause}")
    return lines


def _cells(probe: TaskProbe) -> tuple[str, str]:
    """(state, details) of one task."""
    elapsed = ""
    if probe.started_t is not None and probe.finished_t is not None:
        elapsed = f"{probe.finished_t - probe.started_t:.1f}s"
    result = probe.result or {}
    if probe.succeeded:
        sums = ", ".join(f"{s:g}" for s in result.get("sums", []))
        return "ok", (f"{elapsed}  joined in {result.get('join_s', 0):.1f}s, "
                      f"{result.get('what')} in {result.get('collective_s', 0):.2f}s: {sums}")
    if probe.failed:
        return "FAILED", f"{elapsed}  {probe.error or result.get('error')}".strip()
    if not probe.runs_probe and probe.started_t is not None and (
            probe.exit is None or probe.stopped):
        return "ok", "served"
    if probe.timed_out:
        return "TIMEOUT", _stage(probe)
    if probe.stopped or probe.exit is not None:
        return "stopped", _stage(probe)
    return "MISSING", _stage(probe)
