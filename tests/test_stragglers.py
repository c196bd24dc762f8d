"""The straggler radar's pure parts, with recorded samples: the judgement
(launcher/job/detect/stragglers.py), the host signals the agent reads
(launcher/agent/health.py, NVML through recorded answers) and the heartbeat's
check (launcher/job/run/protocol.py).

The recorded runs (tests/data/stragglers/) are health samples and step
reports of tests/scripts/steady_train.py under `--local 2` on this 2-core
machine while others ran their tests: `balanced` as it is, `cpu_contended`
with worker1 pinned to CPU 0 beside two busy loops; `balanced_io` (epochs of
150 steps, each with an evaluation and a BackupAndRestore save) and
`input_waits` (worker1's tf.data map sleeping 0.1 s a batch) with the input
waits the agent counts (`io_wait`), at a load of about 11.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.agent import health
from launcher.job.detect.stragglers import Detector, describe
from launcher.job.record import eventlines
from launcher.job.record import events as ev
from launcher.job.run.protocol import check_message
from launcher.spec.config import ConfigError, parse_config
from launcher.views import narrate
from tests.fake_agents import harness

DATA = Path(__file__).parent / "data" / "stragglers"
HOSTS = {"worker0": "host0", "worker1": "host1"}


def replay(name: str, detector: Detector | None = None) -> tuple[Detector, list]:
    detector = detector or Detector(HOSTS)
    findings = []
    for line in (DATA / name).read_text().splitlines():
        record = json.loads(line)
        if record["event"] == "progress":
            detector.progress(record["t"], record["step"])
        else:
            found = detector.health(record["t"], record["task"], record["t"], record["figures"])
            findings += [(record["t"], found)] if found else []
    return detector, findings


def test_a_worker_contended_for_its_cpu_is_named_with_its_evidence():
    _, findings = replay("cpu_contended.jsonl")
    assert len(findings) == 1
    t, finding = findings[0]
    assert (finding.task, finding.host, finding.source) == ("worker1", "host1", "host")
    assert 1.5 <= finding.slowdown < 5
    own, peers = finding.evidence["task"], finding.evidence["peers"]
    assert finding.evidence["unit"] == "ms_per_step"
    assert own["waiting_for_cpu"] > 1.5 * peers["waiting_for_cpu"]
    first_step = next(json.loads(x)["t"] for x in (DATA / "cpu_contended.jsonl").open()
                      if '"progress"' in x)
    assert t - first_step < 60
    assert "waiting for a CPU" in describe(finding.evidence)


def test_a_balanced_job_names_nobody():
    assert replay("balanced.jsonl")[1] == []
    assert replay("balanced_io.jsonl")[1] == []  # its saves and evaluations read files too


def test_a_worker_waiting_for_its_input_is_named_with_its_evidence():
    _, findings = replay("input_waits.jsonl")
    assert len(findings) == 1
    t, finding = findings[0]
    assert (finding.task, finding.host, finding.source) == ("worker1", "host1", "host")
    assert finding.slowdown >= 1.5
    own, peers = finding.evidence["task"], finding.evidence["peers"]
    # a busy thread always blocked in its sleep: about a step's time, each step
    assert own["waiting_for_io"] > 50 and peers["waiting_for_io"] < 10
    assert own["waiting_for_cpu"] < 2 * peers["waiting_for_cpu"]  # not a CPU matter
    first_step = next(json.loads(x)["t"] for x in (DATA / "input_waits.jsonl").open()
                      if '"progress"' in x)
    assert t - first_step < 60
    assert "waiting for input (reads, sleeps)" in describe(finding.evidence)


def _feed(detector: Detector, seconds: float, *, slow: str | None, steps_per_s: float = 10,
          start: float = 0.0, step0: int = 0, pause: tuple[float, float] | None = None,
          counters: dict | None = None) -> list:
    """Synthetic samples every 3 s (steps every 1 s); `slow` waits 2 s per second."""
    counters = counters if counters is not None else {t: [0.0, 0.0] for t in HOSTS}
    found, step = [], step0
    t = start
    while t < start + seconds:
        t += 1.0
        if pause is None or not pause[0] <= t - start < pause[1]:
            step += int(steps_per_s)
        detector.progress(t, step)
        if int(t) % 3 == 0:
            for task in HOSTS:
                counters[task][0] += 0.9
                counters[task][1] += 6.0 if task == slow else 1.5
                figures = {"cpu_s": counters[task][0], "run_delay_s": counters[task][1]}
                got = detector.health(t, task, t, figures)
                found += [(t, got)] if got else []
    return found


def test_the_first_steps_and_pauses_never_name_anyone():
    detector = Detector(HOSTS)
    assert _feed(detector, 8, slow="worker1") == []  # the warm-up
    # The rounds of a pause of the steps (a checkpoint save, an evaluation, an
    # epoch end) do not count: two rounds, a pause, two rounds: named.
    detector = Detector(HOSTS)
    found = _feed(detector, 28, slow="worker1", pause=(12, 18))
    assert [(t, f.task, f.samples) for t, f in found] == [(24.0, "worker1", 4)]
    # A pause longer than 30 s starts the agreement again.
    detector, counters = Detector(HOSTS), {t: [0.0, 0.0] for t in HOSTS}
    assert _feed(detector, 56, slow="worker1", pause=(12, 50), counters=counters) == []
    later = _feed(detector, 9, slow="worker1", start=56, step0=200, counters=counters)
    assert [f.task for _, f in later] == ["worker1"]


def test_a_task_is_named_once():
    detector = Detector(HOSTS)
    assert len(_feed(detector, 120, slow="worker1")) == 1


def test_traces_name_the_task_its_peers_wait_for():
    detector = Detector(HOSTS)
    _feed(detector, 12, slow=None)
    slow_input = {"worker0": {"step_ms": 60.0, "collective_ms": 48.0, "input_ms": 1.0,
                              "compute_ms": 11.0},
                  "worker1": {"step_ms": 60.0, "collective_ms": 3.0, "input_ms": 46.0,
                              "compute_ms": 11.0}}
    assert detector.trace(12.5, slow_input) is None  # one trace is not enough
    _feed(detector, 3, slow=None, start=12, step0=120)
    finding = detector.trace(15.5, slow_input)
    assert finding is not None and (finding.task, finding.source) == ("worker1", "trace")
    assert finding.slowdown == pytest.approx(57 / 12, rel=0.01)
    assert finding.evidence["task"]["input_ms"] == 46.0
    assert "waiting for input 46 ms/step (peers 1)" in describe(finding.evidence)
    # The host's view of the same rounds stands beside the trace's.
    waits = finding.evidence["task"]["waiting_for_cpu"], finding.evidence["peers"][
        "waiting_for_cpu"]
    assert waits[0] == waits[1] > 0


def test_balanced_traces_name_nobody():
    detector = Detector(HOSTS)
    _feed(detector, 12, slow=None)
    even = {"worker0": {"step_ms": 60.0, "collective_ms": 20.0},
            "worker1": {"step_ms": 60.0, "collective_ms": 17.0}}
    assert [detector.trace(12.5 + i, even) for i in range(3)] == [None] * 3


# ------------------------------------------------------------------ GPU (NVML)

class RecordedNvml:
    """pynvml's answers as recorded on a host with two GPUs, one throttled."""

    NVML_CLOCK_SM = 1
    NVMLError = RuntimeError

    def __init__(self, clocks: list[float], pids: list[list[int]]) -> None:
        self.clocks, self.pids = clocks, pids

    def nvmlDeviceGetCount(self):  # noqa: N802 - pynvml's names
        return len(self.clocks)

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, i):  # noqa: N802
        return [type("P", (), {"pid": pid})() for pid in self.pids[i]]

    def nvmlDeviceGetUtilizationRates(self, i):  # noqa: N802
        return type("U", (), {"gpu": 97, "memory": 40})()

    def nvmlDeviceGetClockInfo(self, i, kind):  # noqa: N802
        return self.clocks[i]

    def nvmlDeviceGetMaxClockInfo(self, i, kind):  # noqa: N802
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, i):  # noqa: N802
        return 0x40 if self.clocks[i] < 1500 else 0  # HW thermal slowdown


def test_nvml_figures_of_the_gpus_a_task_uses():
    nvml = RecordedNvml([1980, 1110], [[101], [202]])
    assert health.gpu_figures(nvml, 202) == {"gpu_util": 97.0, "sm_clock_mhz": 1110.0,
                                             "sm_clock_max_mhz": 1980.0, "gpu_throttle": 64.0}
    assert health.gpu_figures(nvml, 101)["sm_clock_mhz"] == 1980.0
    sampler = health.Health(load_nvml=lambda: nvml)
    assert sampler.sample({"worker1": os.getpid()})["worker1"]["sm_clock_mhz"] == 1110.0


def test_no_nvml_no_gpu_figures():
    figures = health.Health(load_nvml=lambda: None).sample({"w": os.getpid()})["w"]
    assert {"run_delay_s", "cpu_s"} <= set(figures) and "gpu_util" not in figures


def test_a_throttled_gpu_is_named():
    detector = Detector(HOSTS)
    counters = 0.0
    found = []
    for t in range(1, 40):
        detector.progress(float(t), t * 10)
        if t % 3 == 0:
            counters += 0.9
            for task, clock in (("worker0", 1980.0), ("worker1", 1110.0)):
                figures = {"cpu_s": counters, "run_delay_s": 0.1 * t, "gpu_util": 97.0,
                           "sm_clock_mhz": clock, "sm_clock_max_mhz": 1980.0}
                got = detector.health(float(t), task, float(t), figures)
                found += [got] if got else []
    assert [(f.task, f.source) for f in found] == [("worker1", "gpu")]
    assert found[0].slowdown == pytest.approx(1980 / 1110, rel=0.01)
    assert "SM clock 1110 MHz (peers 1980)" in describe(found[0].evidence)


# ------------------------------------------------------------- host signals


def test_run_delay_and_cpu_of_a_real_process():
    sched = health.schedstat(os.getpid())
    assert sched is not None and sched[0] > 0
    assert health.cpu_seconds(os.getpid()) > 0
    assert health.schedstat(2**22 + 7) is None  # gone: no figures


_THREADS = """
import os, sys, threading, time
def name(text):
    with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as handle:
        handle.write(text)
def sleeper(own):
    if own:
        name("mgpu-poll")  # the launcher's own: never counted
    while True:
        time.sleep(0.01)  # a busy thread, always in a sleep: an input wait
def idler():
    threading.Event().wait()  # parked on a futex: not counted
for target, args in ((sleeper, (False,)), (sleeper, (True,)), (idler, ())):
    threading.Thread(target=target, args=args, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


def test_input_waits_of_a_real_process_count_its_busy_blocked_threads():
    """One thread sleeping 10 ms at a time (woken 100 times a second), one of
    the launcher's own doing the same, one parked: about one thread waits."""
    child = subprocess.Popen([sys.executable, "-c", _THREADS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        sampler = health.Health(every_s=0.0, load_nvml=lambda: None)
        assert "io_wait" not in sampler.sample({"w": child.pid})["w"]  # no wakeups known yet
        waits = []
        for _ in range(5):
            time.sleep(0.5)  # a span to count wakeups over (no event to wait for)
            waits.append(sampler.sample({"w": child.pid})["w"]["io_wait"])
    finally:
        child.kill()
        child.wait()
    assert 0.6 <= statistics.median(waits) <= 1.0, waits


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_throttling_is_read_under_both_versions(tmp_path: Path, version: str):
    proc, root = tmp_path / "proc", tmp_path / "cg"
    (proc / "42").mkdir(parents=True)
    if version == "v2":
        (proc / "42" / "cgroup").write_text("0::/job/task\n")
        (root / "job" / "task").mkdir(parents=True)
        (root / "job" / "task" / "cpu.stat").write_text(
            "usage_usec 100\nnr_throttled 3\nthrottled_usec 2500000\n")
    else:
        (proc / "42" / "cgroup").write_text("4:memory:/x\n3:cpu,cpuacct:/job\n")
        (root / "cpu,cpuacct" / "job").mkdir(parents=True)
        (root / "cpu,cpuacct" / "job" / "cpu.stat").write_text(
            "nr_periods 10\nnr_throttled 3\nthrottled_time 2500000000\n")
    assert health.throttled_seconds(42, str(proc), str(root)) == 2.5


def test_the_sampler_samples_at_its_rate():
    sampler = health.Health(every_s=3.0, load_nvml=lambda: None)
    assert [sampler.due(t) for t in (0.0, 1.0, 2.9, 3.0, 4.0, 6.1)] == \
        [True, False, False, True, False, True]


def test_the_heartbeat_keeps_known_finite_health_figures():
    clean = check_message({"ev": "heartbeat", "t": 1.0, "tasks": {"worker1": {
        "cpu": 50.0, "health": {"run_delay_s": 1.5, "cpu_s": 2.0, "bogus": 1,
                                "gpu_util": float("nan"), "throttled_s": True}}}})
    assert clean["tasks"]["worker1"]["health"] == {"run_delay_s": 1.5, "cpu_s": 2.0}


def test_the_straggler_event_in_words_and_as_a_line():
    event = ev.Straggler(generation=0, task="worker1", host="host1", slowdown=2.1,
                         evidence={"unit": "ms_per_step",
                                   "task": {"cpu": 25.0, "waiting_for_cpu": 180.0},
                                   "peers": {"cpu": 27.0, "waiting_for_cpu": 70.0}},
                         samples=4)
    assert narrate.line(event) == (
        "notice", "straggler: host1/worker1 is 2.1x slower than its peers: waiting for a "
        "CPU 180 ms/step (peers 70), on CPU 25 ms/step (peers 27)")
    record = ev.to_record(event, 5.0)
    assert {"task", "host", "slowdown", "evidence"} <= set(record)
    assert eventlines.from_record(json.loads(json.dumps(record))) == event


# ------------------------------------------------------------ the cluster file

LOCAL = """\
hosts:
  - {name: a, address: 127.0.0.1}
  - {name: b, address: 127.0.0.1}
restart:
  on_straggler: VALUE
"""


def test_on_straggler_is_warn_by_default_and_checked():
    assert parse_config(LOCAL.replace("  on_straggler: VALUE\n", "max_restarts: 3\n")
                        .replace("restart:\n", "restart:\n  "),
                        source="c.yaml").config.restart.on_straggler == "warn"
    with pytest.raises(ConfigError) as info:
        parse_config(LOCAL.replace("VALUE", "repalce"), source="c.yaml")
    (problem,) = info.value.problems
    assert "c.yaml:5: restart.on_straggler:" in problem and "'warn' or 'replace'" in problem
    with pytest.raises(ConfigError) as info:
        parse_config(LOCAL.replace("VALUE", "replace"), source="c.yaml")
    (problem,) = info.value.problems
    assert "restart.on_straggler" in problem and "needs a spare host" in problem
    spare = LOCAL.replace("VALUE", "replace")
    spare = spare.replace("  - {name: b, address: 127.0.0.1}\n",
                          "  - {name: b, address: 127.0.0.1}\n"
                          "  - {name: c, address: 127.0.0.1, spare: true}\n")
    assert parse_config(spare, source="c.yaml").config.restart.on_straggler == "replace"


# ------------------------------------------- the supervisor's radar, end to end


def slow_worker1(name: str, marks: dict[int, dict] | None = None, step0: int = 0) -> list:
    """40 s of a fake agent's events: steps every second (10 a second), and every
    3 s a heartbeat whose health says worker1 waits for a CPU four times as long
    as its peer. `marks`: extra progress data at those seconds (a checkpoint)."""
    marks = marks or {}
    events = [(float(s), "progress", {"data": {"step": step0 + 10 * s, **marks.get(s, {})}})
              for s in range(1, 41)]
    for s in range(3, 41, 3):
        delay = s * (2.0 if name == "worker1" else 0.5)
        events.append((s + 0.5, "heartbeat", {"tasks": {name: {"cpu": 50.0, "health": {
            "cpu_s": 0.9 * s, "run_delay_s": delay, "throttled_s": 0.0}}}}))
    return events


def replace_cluster(tmp_path: Path, hosts: int = 3, spares: tuple[int, ...] = (2,)):
    """A local cluster of `hosts`, those numbered in `spares` spare, on_straggler: replace."""
    from launcher.spec.config import ClusterConfig, LoadedConfig

    return LoadedConfig(config=ClusterConfig.model_validate({
        "name": "r", "transport": "local", "ports": {"base": "auto"},
        "hosts": [{"address": "127.0.0.1", "name": f"host{i}", "spare": i in spares}
                  for i in range(hosts)],
        "restart": {"on_straggler": "replace"}}), source=None, base_dir=tmp_path)


CHECKPOINT = {"checkpoint": 1}
FINISHED = [(1.0, "progress", {"data": {"step": 400}}), (2.0, "exit", {"code": 0})]


def test_the_supervisor_names_a_straggler_in_events_terminal_and_summary(tmp_path: Path):
    """Fake agents (tests/fake_agents.py): worker1's heartbeats say it waits for
    a CPU four times as long as worker0; both report steps every second."""
    def script(generation: int, name: str):
        return [*slow_worker1(name), (41.0, "exit", {"code": 0})]

    h = harness(tmp_path, script)
    result = h.supervisor.run()
    (event,) = h.events("straggler")
    assert (event["task"], event["host"], event["source"]) == ("worker1", "host1", "host")
    assert event["slowdown"] == pytest.approx((0.9 + 2.0) / (0.9 + 0.5), rel=0.01)
    assert event["evidence"]["task"]["waiting_for_cpu"] == 200.0  # ms per step, 10 steps/s
    assert "straggler: host1/worker1 is 2.1x slower than its peers" in h.output.getvalue()
    (entry,) = result.to_json()["stragglers"]
    assert (entry["task"], entry["host"], entry["slowdown"]) == \
        ("worker1", "host1", event["slowdown"])
    health = h.events("health")  # once a minute per task: the first sample of each
    assert sorted(e["task"] for e in health) == ["worker0", "worker1"]


def test_the_live_table_marks_the_straggler():
    from launcher.job.record.story import TaskRow
    from launcher.views.live import describe_row, render

    rows = [TaskRow(label=f"host{i}/worker{i}", host=f"host{i}", task=f"worker{i}",
                    state="running", generation=0, restarts=0, step=300, steps_per_s=7.5,
                    loss=None, cpu_percent=30.0, rss_mb=400.0, silent_s=1.0,
                    slowdown=2.51 if i else None) for i in range(2)]
    table = "\n".join(render(rows, width=120, height=10, elapsed_s=50, colour=False))
    assert "running (straggler 2.5x)" in table
    assert table.count("straggler") == 1
    assert "host1/worker1 running (straggler 2.5x)" in describe_row(rows[1])


def test_replace_sets_the_slow_host_aside_at_the_next_checkpoint(tmp_path: Path):
    """restart.on_straggler: replace, a spare host: at the first checkpoint after
    worker1 is named, the job restarts with the spare in host1's place."""
    loaded = replace_cluster(tmp_path)

    def script(generation: int, name: str):
        return FINISHED if generation else slow_worker1(name, {35: CHECKPOINT})

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace")
    result = h.supervisor.run()
    (named,) = h.events("straggler")
    assert (named["task"], named["action"], named["spare"]) == ("worker1", "replace", "host2")
    assert "; host2 replaces host1 at the next checkpoint (restart.on_straggler: replace)" \
        in h.output.getvalue()  # said when named, not only when it happens
    (failure,) = h.events("failure_detected")
    assert (failure["task"], failure["kind"]) == ("worker1", "straggler")
    assert failure["t"] > named["t"] + 10  # at the checkpoint, not when named
    assert "replaced by a spare host at a checkpoint" in failure["reason"]
    assert h.events("task_unconfirmed") == []  # the slow host's task was stopped, confirmed
    (chosen,) = h.events("hosts_chosen")
    assert chosen["message"] == "host2 replaces host1"
    (restart,) = h.events("restart")
    assert restart["counted"] is False  # the checkpoint moved: a free restart
    placed = {p["task"]: p["host"] for p in h.events("launch")[-1]["tasks"]}
    assert placed == {"worker0": "host0", "worker1": "host2"}
    assert result.status == "succeeded"
    assert "\nmgpu-launch   | host2 replaces host1\n" in h.output.getvalue()


def test_replace_comes_at_the_save_a_step_report_times_not_the_next_health_sample(
        tmp_path: Path):
    """An unmodified Keras script: no `checkpoint` report, the save timed by the
    runtime (`save_s`) and seen on disk. The generation ends at that report,
    not up to a health period (3 s of steps to redo) later."""
    loaded = replace_cluster(tmp_path)
    saved = {"ckpt/checkpoint": (1,)}

    def script(generation: int, name: str):
        return FINISHED if generation else slow_worker1(name, {34: {"save_s": 0.2}})

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace",
                checkpoint_probe=lambda: dict(saved) if h.clock() >= 1033.9 else {})
    h.supervisor.run()
    (named,) = h.events("straggler")
    (failure,) = h.events("failure_detected")
    assert failure["kind"] == "straggler" and named["t"] < failure["t"]
    assert failure["t"] - h.events("launch")[0]["t"] == pytest.approx(34.0, abs=0.1)


def test_with_no_idle_spare_left_the_straggler_is_named_and_the_job_goes_on(tmp_path: Path):
    """The spare took host1's place; generation 1's worker1, on it, is slow too:
    named, said to stay (no spare is idle), and the job is not restarted."""
    loaded = replace_cluster(tmp_path)

    def script(generation: int, name: str):
        events = slow_worker1(name, {30: CHECKPOINT, 35: CHECKPOINT}, step0=400 * generation)
        return events if generation == 0 else [*events, (41.0, "exit", {"code": 0})]

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace")
    result = h.supervisor.run()
    first, second = h.events("straggler")
    assert (first["host"], first["spare"]) == ("host1", "host2")
    assert (second["generation"], second["host"], second["spare"]) == (1, "host2", "")
    assert "straggler: host2/worker1 is 2.1x slower than its peers" in h.output.getvalue()
    assert "no spare host is idle to take host2's place: named only" in h.output.getvalue()
    assert len(h.events("failure_detected")) == 1 and len(h.events("restart")) == 1
    assert result.status == "succeeded"


def test_a_spare_whose_agent_is_gone_does_not_replace_the_slow_host(tmp_path: Path):
    """host2, the spare, lost its agent while idle: setting host1 aside would
    end a working generation to wait for a host that is gone (and fail the job
    after `host_wait_s`). worker1 is named, the line says no spare is idle, and
    the job goes on where it is."""
    loaded = replace_cluster(tmp_path)

    def script(generation: int, name: str):
        return [*slow_worker1(name, {35: CHECKPOINT}), (41.0, "exit", {"code": 0})]

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace", host_wait_s=5.0)
    h.links["host2"].close()
    result = h.supervisor.run()
    (named,) = h.events("straggler")
    assert (named["host"], named["action"], named["spare"]) == ("host1", "replace", "")
    assert "no spare host is idle to take host1's place: named only" in h.output.getvalue()
    assert h.events("failure_detected") == [] and h.events("restart") == []
    assert result.status == "succeeded"


def test_the_restart_takes_the_spare_whose_agent_is_there(tmp_path: Path):
    """Two spares, the first one's agent gone: the line names the second, and
    the restart puts the second in host1's place (not waiting for the first)."""
    loaded = replace_cluster(tmp_path, hosts=4, spares=(2, 3))

    def script(generation: int, name: str):
        return FINISHED if generation else slow_worker1(name, {35: CHECKPOINT})

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace", host_wait_s=5.0)
    h.links["host2"].close()
    result = h.supervisor.run()
    (named,) = h.events("straggler")
    assert named["spare"] == "host3"
    (chosen,) = h.events("hosts_chosen")
    assert chosen["message"] == "host3 replaces host1"
    placed = {p["task"]: p["host"] for p in h.events("launch")[-1]["tasks"]}
    assert placed == {"worker0": "host0", "worker1": "host3"}
    assert result.status == "succeeded"


# ------------------------------------------------ traces, taken by the radar


class FakeProfiler:
    """job/run/profiling.py's Profiler as the radar uses it: each capture answers at
    once with the recorded per-task summaries (totals over the window, s)."""

    def __init__(self, answers: dict[str, dict[str, float]]) -> None:
        self.answers, self.current, self.asked = answers, None, []

    def capture(self, gen, links, seconds, *, ident, keep_files, on_done):
        from types import SimpleNamespace

        self.asked.append((ident, seconds, keep_files))
        traces = {name: SimpleNamespace(summary=summary) for name, summary in self.answers.items()}
        on_done(SimpleNamespace(traces=traces))


def test_the_radar_traces_rarely_and_names_the_task_its_peers_wait_for(tmp_path: Path,
                                                                          monkeypatch):
    from launcher.job.detect.generation import Generation
    from launcher.job.detect.radar import Radar
    from launcher.job.record.states import TaskRecord
    from launcher.spec.config import local_config
    from launcher.spec.plan import build_plan

    plan = build_plan(local_config(2), ["x.py"], run_dir=str(tmp_path), ports=[1, 2])
    gen = Generation(plan, {t.name: TaskRecord(t) for t in plan.tasks})
    # worker1's input waits 46 ms a step; worker0 waits for it in the all-reduce.
    profiler = FakeProfiler({
        "worker0": {"window_s": 1.0, "steps": 16, "step_s": 0.0625, "collective_s": 0.77,
                    "input_s": 0.02, "compute_s": 0.21},
        "worker1": {"window_s": 1.0, "steps": 16, "step_s": 0.0625, "collective_s": 0.05,
                    "input_s": 0.74, "compute_s": 0.21}})
    told, clock = [], [0.0]
    assert Radar(told.append, lambda: clock[0], profiler=profiler)._profiler is None  # asked only
    monkeypatch.setenv("MGPU_STRAGGLER_TRACES", "1")
    radar = Radar(told.append, lambda: clock[0], profiler=profiler)
    for second in range(1, 60):
        clock[0] = float(second)
        radar.progress(gen, {"step": 16 * second})
        radar.tick(gen, links={})
    assert [ident for ident, _, _ in profiler.asked] == ["radar-g0-1", "radar-g0-2"]
    assert {(s, keep) for _, s, keep in profiler.asked} == {(1.0, False)}
    (named,) = [e for e in told if isinstance(e, ev.Straggler)]
    assert (named.task, named.host, named.source) == ("worker1", "host1", "trace")
    assert named.slowdown == pytest.approx((62.5 - 3.125) / (62.5 - 48.125), rel=0.01)
    assert named.evidence["task"]["input_ms"] == pytest.approx(46.2, abs=0.1)


def test_status_of_a_running_job_names_its_straggler(tmp_path: Path):
    from launcher.outlets.rundir import load_run
    from launcher.views.records import render_status

    event = ev.Straggler(generation=0, task="worker1", host="host1", slowdown=2.5,
                         evidence={"unit": "ms_per_step", "task": {"waiting_for_cpu": 315.0},
                                   "peers": {"waiting_for_cpu": 120.0}})
    lines = [{"t": 1.0, "event": "launch", "v": 2, "generation": 0, "tasks": [
        {"task": f"worker{i}", "host": f"host{i}"} for i in range(2)]},
        ev.to_record(event, 30.0)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    text = render_status(load_run(tmp_path, alive=lambda launch: True), now=31.0)
    assert "straggler: host1/worker1 is 2.5x slower than its peers: waiting for a CPU " \
        "315 ms/step (peers 120)" in text


def test_a_late_report_of_a_save_before_the_naming_is_not_the_next_checkpoint(tmp_path: Path):
    """Under load the slow worker's report of an older save (step 100, made
    before the naming) arrives after it: the replacement waits for a save past
    the step the job had reached when it named the straggler (CI saw a spare
    resume from step 40 where step 80 was next)."""
    loaded = replace_cluster(tmp_path)

    def script(generation: int, name: str):
        late = {"checkpoint": 1, "saved": 100}  # step 100's save, told at second 30
        return FINISHED if generation else slow_worker1(name, {30: late, 35: CHECKPOINT})

    h = harness(tmp_path, script, loaded=loaded, on_straggler="replace")
    assert h.supervisor.run().status == "succeeded"
    (failure,) = h.events("failure_detected")
    # Named at 18.5 s: replaced at the save of second 35, not at 30's late report.
    assert failure["t"] - h.events("straggler")[0]["t"] == pytest.approx(16.5, abs=0.6)
