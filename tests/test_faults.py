"""Real faults against real jobs: kill -9, SIGSTOP, crash loops, SIGTERM, lost hosts.

Every test runs the real CLI (`python -m launcher`) with real agents and, where
TensorFlow matters, real MultiWorkerMirroredStrategy workers; the faults are
real signals sent to real pids read from `events.jsonl`. Timings are read from
the launcher's own event timestamps, never from wall time around a busy
machine. After every test, no process of the job may be left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from launcher.job.detect.stalls import STOPPED_HANG_S
from launcher.job.record import story
from launcher.job.record.goodput import PARTS as GOODPUT_PARTS
from launcher.outlets.rundir import load_run
from launcher.views.records import render_status
from tests.conftest import (
    SCRIPTS,
    alive,
    read_events,
    read_summary,
    start_cli,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.e2e

TRAIN = str(SCRIPTS / "fault_train.py")
STEPS = str(SCRIPTS / "fault_steps.py")


class Job:
    """A launcher run in a subprocess, and every process it ever started."""

    def __init__(self, args: list[str], cwd: Path, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.proc = start_cli(["--run-dir", str(run_dir), *args], cwd=cwd)
        self.family: set[int] = set()
        self.output = ""

    def events(self, name: str | None = None, **match) -> list[dict]:
        self.look()
        return [e for e in read_events(self.run_dir)
                if (name is None or e["event"] == name)
                and all(e.get(k) == v for k, v in match.items())]

    def look(self) -> None:
        """Remember the launcher's descendants (agents, tasks) as they come and go."""
        try:
            self.family.update(p.pid for p in psutil.Process(self.proc.pid).children(True))
        except psutil.Error:
            pass

    def agent(self, host: str) -> psutil.Process:
        """The agent process of a simulated host (a child of the launcher)."""
        for child in psutil.Process(self.proc.pid).children():
            try:
                argv = child.cmdline()
            except psutil.Error:
                continue
            if "launcher.agent" in argv and argv[argv.index("--host") + 1] == host:
                self.family.add(child.pid)
                return child
        raise AssertionError(f"no agent for {host}")

    def pids(self) -> dict[tuple[int, str], int]:
        return {(e["generation"], e["task"]): e["pid"] for e in self.events("task_started")}

    def wait_event(self, name: str, timeout: float, **match) -> dict:
        found = wait_for(lambda: self.events(name, **match), timeout=timeout,
                         what=f"event {name} {match}")
        return found[0]

    def finish(self, timeout: float) -> int:
        try:
            self.output, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.output, _ = self.proc.communicate()
            raise AssertionError("launcher did not finish:\n" + self.output[-3000:]) from None
        return self.proc.returncode

    def assert_nothing_left(self) -> None:
        everyone = self.family | set(self.pids().values())
        wait_for(lambda: not alive(everyone), timeout=10,
                 what=f"every process of the job to exit (left: {alive(everyone)})")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def jobs():
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()
        # A failed test must not leave its processes to the next one either.
        for pid in alive(job.family | set(job.pids().values())):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def launch(jobs: list[Job], args: list[str], cwd: Path, name: str = "run") -> Job:
    job = Job(args, cwd, cwd / name)
    jobs.append(job)
    return job


def write_yaml(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def checksums(output: str) -> dict[str, str]:
    return dict(re.findall(r"^(\S+?) +\| WEIGHTS_CHECKSUM ([0-9.]+)", output, re.M))


def training_epochs(job: Job, generation: int) -> set[int]:
    return {e["epoch"] for e in job.events("progress", generation=generation) if "epoch" in e}


# ---------------------------------------------------------------------- crashes


def test_kill_9_mid_epoch_resumes_from_the_checkpoint(workdir: Path, jobs):
    job = launch(jobs, ["--local", "2", TRAIN, "--epochs", "4"], workdir)
    # Both workers in (0-based) epoch 2 = the middle of epoch 3 of 4, past its
    # second step (the resumed generation trains steps 21 and 22 again).
    wait_for(lambda: all(any(e.get("epoch") == 2 and not e.get("epoch_end")
                             for e in job.events("progress", task=t))
                         for t in ("worker0", "worker1"))
             and any(e.get("epoch") == 2 and e.get("step", 0) >= 22
                     for e in job.events("progress")),
             timeout=180, what="both workers in epoch 3, past its second step")
    running = load_run(job.run_dir)  # `status` of the running job: its time so far
    assert running.goodput["parts"]["startup"] > 0 < running.goodput["productive_s"], running
    os.kill(job.pids()[(0, "worker1")], signal.SIGKILL)
    killed_at = time.time()
    code = job.finish(timeout=180)
    assert code == 0, job.output[-4000:]
    shown = status_json(job.run_dir)  # what a user reads: `status --json`
    assert shown["status"] == "succeeded" and shown["restarts"] == 1
    assert shown["failures"][0]["task"] == "host1/worker1"
    assert shown["failures"][0]["signal"] == 9
    # Detected from the exit itself, not from a hang: as the failure, or, when
    # the peer's aborted collective was told first (a loaded machine), as the
    # root cause it is then judged to be. How fast is bench/recovery.py's to measure.
    detected = [e for e in job.events() if e.get("task") == "worker1"
                and e["event"] in ("failure_detected", "root_cause")][0]
    assert (detected["kind"], detected["signal"]) == ("signal", 9), detected
    print(f"failure detected {detected['t'] - killed_at:.3f} s after the kill")
    # Generation 1 resumed at epoch 3 (0-based 2), never from the start.
    resumed = training_epochs(job, 1)
    assert resumed and min(resumed) >= 2, resumed
    assert re.search(r"\| BEGIN gen=1 epoch=2$", job.output, re.M), job.output[-3000:]
    assert not re.search(r"\| BEGIN gen=1 epoch=[01]$", job.output, re.M)
    sums = checksums(job.output)
    assert len(sums) == 2 and len(set(sums.values())) == 1, sums
    # Where the time went: start-up, the recovery, the steps of epoch 3 trained
    # again, the backups of each epoch's end; said by `status` in words too.
    goodput = shown["goodput"]
    parts = goodput["parts"]
    assert set(parts) == set(GOODPUT_PARTS), parts
    assert abs(sum(parts.values()) - goodput["wall_s"]) <= 0.02 * goodput["wall_s"], goodput
    assert abs(goodput["wall_s"] - shown["wall_s"]) <= 0.02 * shown["wall_s"], goodput
    assert min(parts["training"], parts["startup"], parts["recovery"], parts["redone"],
               parts["checkpointing"]) > 0, goodput
    assert "goodput " in render_status(load_run(job.run_dir)), goodput
    # summary.json is a rendering of the same model: the fold of events.jsonl.
    summary, told = read_summary(job.run_dir), story.fold(read_events(job.run_dir))
    assert {key: summary[key] for key in told.summary()} == \
        json.loads(json.dumps(told.summary()))
    assert summary["goodput"] == told.goodput() == goodput
    job.assert_nothing_left()


def test_sigstop_of_a_worker_is_a_hang_detected_in_seconds(workdir: Path, jobs):
    # worker0, TensorFlow's coordination leader: its freeze also stalls its peer's
    # heartbeats, so the peer is the likelier to be blamed. The harder case of the
    # two; worker1's own agent sees it stopped just the same.
    victim = "worker0"
    job = launch(jobs, ["--local", "2", TRAIN, "--epochs", "4"], workdir)
    wait_for(lambda: all(any(e.get("epoch", -1) >= 1 for e in job.events("progress", task=t))
                         for t in ("worker0", "worker1")),
             timeout=180, what="both workers in epoch 2")
    stopped = job.pids()[(0, victim)]
    os.kill(stopped, signal.SIGSTOP)
    stopped_at = time.time()
    code = job.finish(timeout=180)
    assert code == 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    # Its agent sees it stopped: past the freeze a job must survive
    # (stalls.STOPPED_HANG_S) it is the hung task, never a peer that reports it.
    cause = summary["failures"][0]
    assert cause["task"] == "host0/worker0" and cause["kind"] == "hang", cause
    detected = job.events("failure_detected", generation=0)[0]
    assert STOPPED_HANG_S < detected["t"] - stopped_at < STOPPED_HANG_S + 3, \
        detected["t"] - stopped_at
    # The peer's stacks were taken, and the job was running again within 15 s.
    assert job.events("stacks", generation=0, taken=True), job.events("stacks")
    restarted = job.events("task_started", generation=1)
    assert restarted and max(e["t"] for e in restarted) - stopped_at < 15.0, restarted
    # The teardown ended the stopped process (SIGTERM + SIGCONT, SIGKILL after grace).
    exited = job.events("task_exited", generation=0, task=victim)
    assert exited and exited[0]["stopped_by_launcher"], exited
    assert min(training_epochs(job, 1)) >= 1
    job.assert_nothing_left()


def test_a_silent_task_fails_after_hang_timeout(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", """\
name: silent
transport: local
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: host0}
  - {address: 127.0.0.1, name: host1}
restart: {hang_timeout_s: 3, backoff_s: 0}
""")
    job = launch(jobs, [str(config), STEPS, "--steps", "40", "--fault", "silent"], workdir)
    code = job.finish(timeout=120)
    assert code == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["restarts"] == 1
    cause = summary["failures"][0]
    assert cause["task"] == "host1/worker1" and cause["kind"] == "hang", cause
    assert "hang_timeout_s=3" in cause["description"]
    last = max(e["t"] for e in job.events("progress", generation=0, task="worker1"))
    detected = job.events("failure_detected", generation=0)[0]["t"]
    assert 3.0 <= detected - last < 5.0, detected - last
    # Its Python stacks were taken before the teardown: stuck in the script's loop.
    assert "fault_steps.py" in (job.run_dir / "stacks" / "worker1.txt").read_text()
    assert any("fault_steps.py" in frame for frame in cause["stack"]), cause["stack"]
    resumed = re.search(r"host1/worker1 +\| RESUME gen=1 step=(\d+)", job.output)
    assert resumed and int(resumed.group(1)) > 0, job.output[-3000:]
    job.assert_nothing_left()


def test_the_same_exception_twice_stops_at_once_as_deterministic(workdir: Path, jobs):
    job = launch(jobs, ["--local", "2", "--max-restarts", "3",
                        str(SCRIPTS / "fail_on_worker1.py")], workdir)
    code = job.finish(timeout=120)
    assert code == 1, job.output[-3000:]
    summary = read_summary(job.run_dir)
    # Generation 1 failed exactly as generation 0 did: a third try would too.
    assert summary["status"] == "failed" and summary["restarts"] == 1
    assert summary["stopped_by"] == "deterministic"
    assert "FileNotFoundError at" in summary["message"] and "load_settings" in summary["message"]
    cause = summary["root_cause"]
    assert cause["task"] == "host1/worker1" and cause["error"]["type"] == "FileNotFoundError"
    assert len(summary["failures"]) == 2
    assert "deterministic" in job.output and "root cause: host1/worker1" in job.output
    job.assert_nothing_left()


# ------------------------------------------------------------------ preemption


def test_exit_42_restarts_without_counting_as_a_crash(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", """\
name: preempted
transport: local
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: host0}
  - {address: 127.0.0.1, name: host1}
restart: {max_restarts: 1, backoff_s: 0}
""")
    # The chief asks to be restarted before any step, twice: no progress at all,
    # yet two restarts with max_restarts: 1.
    job = launch(jobs, [str(config), STEPS, "--steps", "5", "--fault", "exit42",
                        "--fault-task", "worker0", "--fault-gens", "2", "--at", "1"], workdir)
    code = job.finish(timeout=120)
    assert code == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 2
    assert [f["kind"] for f in summary["failures"]] == ["preempted", "preempted"]
    assert [e["counted"] for e in job.events("restart")] == [False, False]
    job.assert_nothing_left()


def test_sigterm_to_the_launcher_saves_and_a_new_launch_resumes(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", """\
name: preemptible
transport: local
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: host0}
  - {address: 127.0.0.1, name: host1}
restart: {grace_s: 15}
""")
    args = [str(config), TRAIN, "--epochs", "4", "--preemption"]
    job = launch(jobs, args, workdir, name="first")
    wait_for(lambda: all(any(e.get("epoch") == 1 and e.get("step", 0) >= 13
                             for e in job.events("progress", task=t))
                         for t in ("worker0", "worker1")),
             timeout=180, what="both workers in the middle of epoch 2")
    job.proc.send_signal(signal.SIGTERM)
    code = job.finish(timeout=60)
    assert code == 143, job.output[-4000:]
    assert read_summary(job.run_dir)["status"] == "interrupted"
    # Each task got SIGTERM; TensorFlow's PreemptionCheckpointHandler saved
    # the step all of them agreed on, then exited 42 within the grace period.
    exits = {e["task"]: e for e in job.events("task_exited")}
    assert {t: e["exit_code"] for t, e in exits.items()} == {"worker0": 42, "worker1": 42}, exits
    backup = workdir / "checkpoints" / "preemptible" / "backup" / "chief"
    assert (backup / "checkpoint").exists(), list(backup.parent.rglob("*"))
    job.assert_nothing_left()

    again = launch(jobs, args, workdir, name="second")
    assert again.finish(timeout=180) == 0, again.output[-4000:]
    stop = job.events("stop_requested")[0]
    assert stop["signal"] == signal.SIGTERM
    assert all(e["t"] - stop["t"] < 15 for e in exits.values())  # within grace_s
    reached = max(e["step"] for e in job.events("progress", task="worker0") if "step" in e)
    restored = re.findall(r"^host[01]/worker[01] +\| RESTORED step=(\d+)$", again.output, re.M)
    # Both restored the same step, the one saved at SIGTERM (not an epoch end's).
    assert len(restored) == 2 and len(set(restored)) == 1, again.output[-3000:]
    assert int(restored[0]) >= reached >= 13, (restored, reached)
    begins = re.findall(r"^host0/worker0 +\| BEGIN gen=0 epoch=(\d)$", again.output, re.M)
    # The epoch it was stopped in, again (10 steps an epoch: the save may land
    # a few steps after the SIGTERM, past the epoch the test saw).
    assert begins and int(begins[0]) == int(restored[0]) // 10, again.output[-3000:]
    sums = checksums(again.output)
    assert len(sums) == 2 and len(set(sums.values())) == 1, sums
    again.assert_nothing_left()


# ------------------------------------------------------------------- host loss

TWO_HOSTS = """\
name: {name}
transport: local
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: host0}}
  - {{address: 127.0.0.1, name: host1}}
"""


def test_lost_host_with_shrink_finishes_on_the_remaining_host(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", TWO_HOSTS.format(name="shrink") +
                        "restart: {on_host_loss: shrink, min_workers: 1, backoff_s: 0}\n")
    job = launch(jobs, [str(config), TRAIN, "--epochs", "3"], workdir)
    wait_for(lambda: all(any(e.get("epoch", -1) >= 1 for e in job.events("progress", task=t))
                         for t in ("worker0", "worker1")),
             timeout=180, what="both workers in epoch 2")
    job.agent("host1").kill()  # the whole simulated host: its task dies with its agent
    code = job.finish(timeout=180)
    assert code == 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    assert summary["failures"][0]["kind"] == "host_lost"
    assert job.events("host_lost")[0]["host"] == "host1"
    relaunch = job.events("launch", generation=1)[0]
    assert [t["host"] for t in relaunch["tasks"]] == ["host0"]
    assert min(training_epochs(job, 1)) >= 1  # resumed from the two workers' checkpoint
    assert "continuing without host1" in job.output
    job.assert_nothing_left()


def test_lost_host_with_wait_resumes_when_it_is_back(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", TWO_HOSTS.format(name="wait") +
                        "restart: {on_host_loss: wait, host_wait_s: 30, backoff_s: 0}\n")
    job = launch(jobs, [str(config), STEPS, "--steps", "40"], workdir)
    wait_for(lambda: len(job.events("progress", task="worker1")) >= 5, timeout=60,
             what="worker1 stepping")
    job.agent("host1").kill()
    code = job.finish(timeout=120)
    assert code == 0, job.output[-3000:]
    shown = status_json(job.run_dir)  # what a user reads: `status --json`
    assert shown["restarts"] == 1 and shown["failures"][0]["kind"] == "host_lost"
    assert job.events("host_back")[0]["host"] == "host1"
    relaunch = job.events("launch", generation=1)[0]
    assert [t["host"] for t in relaunch["tasks"]] == ["host0", "host1"]
    resumed = re.search(r"host1/worker1 +\| RESUME gen=1 step=(\d+)", job.output)
    assert resumed and int(resumed.group(1)) > 0, job.output[-3000:]
    # The time from the loss to the host's return is its own part of the ledger.
    parts = shown["goodput"]["parts"]
    assert parts["waiting_for_hosts"] > 0 and parts["recovery"] > 0, shown["goodput"]
    back = job.events("host_back")[0]["t"] - job.events("host_lost")[0]["t"]
    assert abs(parts["waiting_for_hosts"] - back) < 0.01, (back, shown["goodput"])
    job.assert_nothing_left()


def test_stopped_agent_is_a_lost_host_and_a_spare_replaces_it(workdir: Path, jobs):
    config = write_yaml(workdir / "cluster.yaml", TWO_HOSTS.format(name="spare") + """\
  - {address: 127.0.0.1, name: host2, spare: true}
restart: {heartbeat_timeout_s: 3, backoff_s: 0}
""")
    job = launch(jobs, [str(config), STEPS, "--steps", "40"], workdir)
    wait_for(lambda: len(job.events("progress", task="worker1")) >= 5, timeout=60,
             what="worker1 stepping")
    job.agent("host2")  # remembered for the final check
    job.agent("host1").suspend()
    stopped_at = time.time()
    code = job.finish(timeout=120)
    assert code == 0, job.output[-3000:]
    lost = job.events("host_lost")[0]
    assert lost["host"] == "host1" and "no heartbeat" in lost["detail"]
    # The 3 s timeout runs from the agent's last heartbeat (one a second), which
    # may have come up to 1 s before the stop; the upper bound allows for load.
    assert 2.0 <= lost["t"] - stopped_at < 8.0, lost["t"] - stopped_at
    relaunch = job.events("launch", generation=1)[0]
    assert sorted(t["host"] for t in relaunch["tasks"]) == ["host0", "host2"]
    assert "host2 replaces host1" in job.output
    resumed = re.search(r"host2/worker1 +\| RESUME gen=1 step=(\d+)", job.output)
    assert resumed and int(resumed.group(1)) > 0, job.output[-3000:]
    job.assert_nothing_left()


# ------------------------------------------------------- ParameterServerStrategy

PS_CLUSTER = """\
name: {name}
transport: local
strategy: parameter_server
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: host0, roles: {{chief: 1}}}}
  - {{address: 127.0.0.1, name: host1, roles: {{worker: 1}}}}
  - {{address: 127.0.0.1, name: host2, roles: {{ps: 1}}}}
restart: {{backoff_s: 0}}
"""


@pytest.mark.parametrize("victim", ["worker0", "ps0"])
def test_parameter_server_job_survives_a_killed_task(workdir: Path, jobs, victim: str):
    config = write_yaml(workdir / "cluster.yaml", PS_CLUSTER.format(name=f"ps-{victim}"))
    job = launch(jobs, [str(config), str(SCRIPTS / "fault_ps.py"), "--steps", "25"], workdir)
    # A save whose step cannot be read is a progress line without one.
    wait_for(lambda: any(e.get("step", 0) >= 10 for e in job.events("progress", task="chief0")),
             timeout=180, what="the chief at step 10")
    os.kill(job.pids()[(0, victim)], signal.SIGKILL)
    code = job.finish(timeout=180)
    assert code == 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded"
    assert re.search(r"host0/chief0 +\| DONE step=25", job.output), job.output[-3000:]
    if victim == "worker0":
        # The coordinator reschedules the dead worker's closures; the launcher
        # starts that worker alone again, on the same address: a failure on the
        # record, no restart of the job (issue 57 item 3).
        assert summary["restarts"] == 0 and summary["root_cause"] is None
        assert [(f["task"], f.get("restarted_alone")) for f in summary["failures"]] == [
            ("host1/worker0", True)]
        assert re.search(r"job succeeded in [^(]+ \(1 worker restarted alone\)", job.output)
        again = job.events("task_restarted", generation=0)
        assert [e["task"] for e in again] == ["worker0"]
        assert len(job.events("task_started", task="worker0")) == 2
        assert len(job.events("task_started", task="chief0")) == 1
    else:
        assert summary["restarts"] == 1
        assert summary["failures"][0]["task"] == "host2/ps0"
        assert {e["task"] for e in job.events("task_started", generation=1)} == {
            "chief0", "worker0", "ps0"}
        resumed = re.search(r"host0/chief0 +\| RESUME gen=1 step=(\d+)", job.output)
        assert resumed and int(resumed.group(1)) >= 10, job.output[-3000:]
        # Its checkpoint holds no optimizer: where it resumed is said, as unknown.
        [point] = summary["resumed"]
        assert point["generation"] == 1 and "holds no optimizer" in point["unknown"], point
        assert "generation 1 restored a checkpoint, at a step that cannot be told" \
            in job.output
    job.assert_nothing_left()


TF1_CLUSTER = """\
name: {name}
transport: local
strategy: legacy_server
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: h0, roles: {{worker: 1, ps: 1}}}}
  - {{address: 127.0.0.1, name: h1, roles: {{worker: 1}}}}
restart: {{max_restarts: 1, backoff_s: 0}}
"""


def _saved_past_resume(job: Job, generation: int) -> bool:
    """A save of `generation` past where it resumed (its session's first save is there)."""
    resumed = [e["step"] for e in job.events("resumed", generation=generation)]
    if generation and not resumed:
        return False
    start = resumed[0] if resumed else 0
    return any(e.get("saved", -1) > start for e in job.events("progress", generation=generation))


def test_tf1_monitored_session_killed_twice_with_progress_succeeds(workdir: Path, jobs):
    """Issue 57: TF1 between-graph replication (1 ps + 2 workers, replica_device_setter,
    MonitoredTrainingSession saving in its own directory, StopAtStepHook), max_restarts 1,
    worker 1 killed twice with progress between: its Saver's saves are progress (no
    restart counted), its global step is shown; launched again once finished, the
    worker left waiting for a session with the exited chief is named, the job ends."""
    config = write_yaml(workdir / "tf1.yaml", TF1_CLUSTER.format(name="tf1"))
    ckpt = workdir / "own_ckpt"  # the script's own directory, not checkpoint.dir
    script = [str(SCRIPTS / "tf1_monitored.py"), "--dir", str(ckpt), "--last-step", "200",
              "--step-s", "0.04"]
    job = launch(jobs, [str(config), *script], workdir)
    for generation in (0, 1):
        wait_for(lambda g=generation: _saved_past_resume(job, g), timeout=120,
                 what=f"a save in generation {generation} past its resume point")
        os.kill(job.pids()[(generation, "worker1")], signal.SIGKILL)
    assert job.finish(timeout=120) == 0, job.output[-4000:]
    shown = status_json(job.run_dir)
    assert shown["status"] == "succeeded" and shown["restarts"] == 2, shown
    assert [e["counted"] for e in job.events("restart")] == [False, False]
    resumed = [e["step"] for e in job.events("resumed")]
    assert len(resumed) == 2 and 0 < resumed[0] < resumed[1] < 200, resumed
    steps = {t["task"]: t["last_step"] for t in shown["tasks"]}
    assert steps["h0/worker0"] >= 200, steps  # the global step, read off the session
    # Worker 1's session may form late (wait_for_session polls every 30 s): it may
    # be killed, and the chief train the last generation, before it ever ran a
    # step, so its steps are not asserted.
    assert re.search(r"h0/worker0 +worker 0 +succeeded +0 +2\d\d ",
                     render_status(load_run(job.run_dir))), render_status(load_run(job.run_dir))
    job.assert_nothing_left()

    again = launch(jobs, [str(config), *script, "--after-chief", str(workdir / "chief.pid")],
                   workdir, name="again")
    assert again.finish(timeout=120) == 0, again.output[-4000:]
    [cut] = again.events("tail_cut")
    assert (cut["why"], cut["tasks"], cut["peer"]) == ("session", ["h1/worker1"], "h0/worker0")
    assert "h1/worker1: waiting for a TF1 session that needs h0/worker0, which finished" \
        in again.output
    again.assert_nothing_left()


def test_legacy_server_seed_keras_fit_killed_after_a_save_resumes(workdir: Path, jobs):
    """Issue 57, the seed's own shape: an unmodified TF1-era script (its own
    `tf.train.Server` session set with `K.set_session`, variables on the ps, Keras
    `fit` in graph mode, worker 0's `ModelCheckpoint` in its own directory,
    `load_weights` + `initial_epoch`), 1 ps + 2 workers, max_restarts 1; worker 0
    killed after its first save: that save is progress (the restart is free), the
    next generation resumes at it, the job succeeds and its steps are shown."""
    config = write_yaml(workdir / "seed.yaml",
                        TF1_CLUSTER.format(name="seed") + "keras: tf_keras\n")
    script = str(SCRIPTS.parent / "scripts_strategies" / "tf1_server.py")
    job = launch(jobs, [str(config), script, "--dir", str(workdir / "own_ckpt"),
                        "--epochs", "8", "--batch-s", "0.05"], workdir)
    wait_for(lambda: [e for e in job.events("progress", generation=0, task="worker0")
                      if e.get("saved")], timeout=120, what="worker 0's first save")
    os.kill(job.pids()[(0, "worker0")], signal.SIGKILL)
    assert job.finish(timeout=120) == 0, job.output[-4000:]
    shown = status_json(job.run_dir)
    assert shown["status"] == "succeeded" and shown["restarts"] == 1, shown
    assert [e["counted"] for e in job.events("restart")] == [False]  # the save was progress
    saves = [e["saved"] for e in job.events("progress", generation=0) if "saved" in e]
    [resumed] = job.events("resumed")
    assert resumed["generation"] == 1 and resumed["saved_step"] == max(saves), (resumed, saves)
    # The save holds at least the step said (read as it began; the other worker
    # trains on the ps's shared counter while it writes: within an epoch).
    assert resumed["saved_step"] <= resumed["step"] < resumed["saved_step"] + 16, resumed
    assert resumed["epoch"] >= 1 and not job.events("resume_behind"), resumed
    assert re.search(r"h\d/worker\d +\| RESUME epoch=\d", job.output), job.output[-3000:]
    steps = {t["task"]: t["last_step"] for t in shown["tasks"]}
    assert steps["h0/worker0"] > resumed["step"] and steps["h1/worker1"], steps
    text = render_status(load_run(job.run_dir))
    assert re.search(r"h0/worker0 +worker 0 +succeeded +0 +\d+ ", text), text
    assert f"generation 1 resumed at epoch {resumed['epoch']} (step {resumed['step']})" in text
    results = [json.loads(line.partition("RESULT ")[2]) for line in job.output.splitlines()
               if "| RESULT " in line]
    assert results and all(r["variable_devices"] == ["/job:ps/task:0"] for r in results)
    assert "ps0 stopped" in (job.run_dir / "logs" / "h0-ps0.log").read_text()
    job.assert_nothing_left()
