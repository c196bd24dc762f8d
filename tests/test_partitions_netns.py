"""Partitions on the namespace rig (launcher/tools/netsim.py): each simulated
SSH host a network namespace on one bridge, and a host cut off by taking its
cable out (the bridge side of its veth down) while it lives on: no FIN, no
RST, only silence on both sides.

The task is no TensorFlow (seconds less per task, and the behaviour under test
is the launcher's and the agents'): worker 0, the chief, "saves" a file in the
shared checkpoint directory every 50 ms, named by step, generation and host,
and every task ignores SIGTERM as TensorFlow's MWMS workers do, so only the
agent's SIGKILL ends it. Every link a test cuts is put back, every namespace
and link removed, even when it fails.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.tools import netsim
from tests.conftest import alive, read_summary, wait_for
from tests.sshcluster import netns_available, sim_cluster, write_yaml
from tests.test_faults import Job
from tests.test_faults_ssh import agent_lease, job_processes

pytestmark = pytest.mark.e2e

HEARTBEAT_S = 3.0  # restart.heartbeat_timeout_s: the launcher's and the agents' lease
EOF_GRACE_S = 2.0  # the agent's SIGTERM -> SIGKILL when its lease runs out (SSHTransport)

# Generation 0 "trains" until it is stopped (the cut ends it); a later one
# resumes past the last save and ends after 20 more steps.
SAVER = """\
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as TensorFlow's MWMS workers: SIGKILL ends it
ckpt = pathlib.Path(os.environ["MGPU_CHECKPOINT_DIR"])
gen, host = int(os.environ["MGPU_GENERATION"]), os.environ["MGPU_HOST"]
chief = os.environ["MGPU_TASK_INDEX"] == "0"
(ckpt / f"started-g{gen}-{host}").write_text(str(os.getpid()))
step = max((int(p.name.split("-")[1]) for p in ckpt.glob("save-*")), default=0)
(ckpt / f"restored-g{gen}-{host}").write_text(str(step))
print(f"RESTORED step={step}", flush=True)
last = step + 20 if gen else 10**9
deadline = time.monotonic() + 120
while step < last and time.monotonic() < deadline:
    time.sleep(0.05)
    step += 1
    if chief:
        (ckpt / f"save-{step:07d}-g{gen}-{host}").write_text("")
print(f"DONE step={step}", flush=True)
"""


@contextlib.contextmanager
def rig_cluster(tmp_path_factory, count: int):
    why = netns_available()
    if why:  # .ci/run runs as root with iproute2: a failure to fix, not a skip
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    with netsim.switch(count, outsider=False, label="cut") as sw, \
            sim_cluster(tmp_path_factory.mktemp("simcut"), count,
                        addresses=[a for _, a in sw.hosts],
                        netns={i: n for i, (n, _) in enumerate(sw.hosts)}) as sim:
        yield sw, sim


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    with rig_cluster(tmp_path_factory, 3) as made:
        yield made


def _link(sw: netsim.Switch, index: int, state: str) -> None:
    subprocess.run(["ip", "link", "set", f"fwv{sw.tag}{index}o", state],
                   check=True, capture_output=True, text=True)


@contextlib.contextmanager
def cuttable(sw: netsim.Switch) -> Iterator[list[int]]:
    """Yields the list the test appends a host's index to as it cuts it; every
    host cut is plugged back in on the way out."""
    cut: list[int] = []
    try:
        yield cut
    finally:
        for index in cut:
            subprocess.run(["ip", "link", "set", f"fwv{sw.tag}{index}o", "up"],
                           capture_output=True)


def cut_host(sw: netsim.Switch, cut: list[int], index: int) -> float:
    """Take host `index`'s cable out (the bridge side of its veth); the time of the cut."""
    cut.append(index)
    _link(sw, index, "down")
    return time.monotonic()


class RigJob(Job):
    def __init__(self, sim, workdir: Path, name: str, restart: dict,
                 connect_timeout_s: float = 2, python: dict[int, str] | None = None,
                 hello_timeout_s: float | None = None) -> None:
        self.sim = sim
        self.run_name = name = f"{name}-{secrets.token_hex(3)}"
        self.ckpt = workdir / f"ckpt-{name}"
        self.ckpt.mkdir()
        config = sim.config_dict()
        config["name"] = name
        config["checkpoint"] = {"dir": str(self.ckpt)}
        config["ssh"]["connect_timeout_s"] = connect_timeout_s
        if hello_timeout_s is not None:
            config["ssh"]["hello_timeout_s"] = hello_timeout_s
        config["restart"] = {"heartbeat_timeout_s": HEARTBEAT_S, "backoff_s": 0,
                             "warm_standby": "off", **restart}
        config["security"] = {"tf_ports": "open"}  # not under test here
        for index, interpreter in (python or {}).items():
            config["hosts"][index]["python"] = interpreter
        path = write_yaml(workdir / f"{name}.yaml", config)
        script = workdir / "saver.py"
        script.write_text(SAVER)
        super().__init__([str(path), str(script)], workdir, workdir / name)

    def saves(self) -> list[tuple[int, int, str, float]]:
        """(step, generation, host, mtime) of every save in the checkpoint directory."""
        found = []
        for path in self.ckpt.glob("save-*"):
            _, step, gen, host = path.name.split("-", 3)
            found.append((int(step), int(gen[1:]), host, path.stat().st_mtime))
        return sorted(found)

    def cleanup(self) -> None:
        self.kill()
        for pid in alive(self.family | set(self.pids().values()) | job_processes(self.run_name)):
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)


def nothing_left(job: RigJob) -> None:
    """No agent or task of the job on any host, and no sshd session: the cut
    host's stale one ends once its link is back."""
    wait_for(lambda: not job_processes(job.run_name), timeout=10, what="no agent or task left")
    hosts = range(len(job.sim.hosts))
    wait_for(lambda: not any(job.sim.session_pids(i) for i in hosts), timeout=20,
             what="no sshd session left on any host")


@pytest.fixture
def rigjobs():
    started: list[RigJob] = []
    yield started
    for job in started:
        job.cleanup()


def test_the_chiefs_host_cut_mid_epoch_with_shrink(rig, workdir, rigjobs):
    """The chief's host loses its link while it lives: the job goes on with the
    other two and succeeds; the cut host's task is ended by its agent's lease
    while still cut, before the new generation restored; nothing of the job is
    left there once the link is back."""
    sw, sim = rig
    job = RigJob(sim, workdir, "cut-chief", {"on_host_loss": "shrink", "min_workers": 1})
    rigjobs.append(job)
    with cuttable(sw) as cut:
        wait_for(lambda: len(job.saves()) >= 10, timeout=30, what="the chief saving")
        chief = job.pids()[(0, "worker0")]
        assert job.events("task_started", generation=0, task="worker0")[0]["host"] == "host0"
        agent, lease = agent_lease(job.run_name, "host0")
        assert lease == HEARTBEAT_S
        cut_at = cut_host(sw, cut, 0)
        lost = job.wait_event("host_lost", timeout=HEARTBEAT_S + 10, host="host0")
        assert "no heartbeat" in lost["detail"], lost
        # The agent's lease, then its SIGTERM's grace and SIGKILL: gone while still cut.
        wait_for(lambda: not alive([chief, agent]), timeout=HEARTBEAT_S + EOF_GRACE_S + 3,
                 what="the cut chief's task and agent to end")
        ended_after = time.monotonic() - cut_at
        code = job.finish(timeout=40)
        assert code == 0, job.output[-3000:]
        _link(sw, 0, "up")
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    relaunch = job.events("launch", generation=1)[0]
    assert sorted(t["host"] for t in relaunch["tasks"]) == ["host1", "host2"], relaunch
    # No save of the cut side after the new generation restored (files' times,
    # the new chief's restore marker written before it trained a step).
    restored_at = (job.ckpt / "restored-g1-host1").stat().st_mtime
    late = [s for s in job.saves() if s[1] == 0 and s[3] >= restored_at]
    assert not late, (late, restored_at)
    resumed = int((job.ckpt / "restored-g1-host1").read_text())
    assert resumed == max(s[0] for s in job.saves() if s[1] == 0), resumed
    assert re.search(r"host1/worker0 +\| DONE step=", job.output), job.output[-2000:]
    assert ended_after <= HEARTBEAT_S + EOF_GRACE_S + 3, ended_after
    nothing_left(job)


# The hosts' python for one host: its agent (only) waits at a gate before it
# starts, so a test can cut the host's link between the agent's start over SSH
# and its hello. After `exec` the agent keeps the pid written.
GATED_AGENT = """\
#!/bin/sh
case "$*" in
  *launcher.agent*)
    echo $$ > {gate}/agent-starting
    i=0
    while [ ! -e {gate}/go ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done;;
esac
exec {python} "$@"
"""


def test_a_host_cut_during_the_launch_is_named_and_nothing_runs(rig, workdir, rigjobs):
    """host2's link is cut after its agent was started over SSH, before its
    hello: the launch stops naming host2, no task starts anywhere, and the
    agent behind the cut ends by its lease while still cut; nothing of the job
    is left once the link is back."""
    sw, sim = rig
    gate = workdir / "gate"
    gate.mkdir()
    wrapper = workdir / "gated-python"
    wrapper.write_text(GATED_AGENT.format(gate=gate, python=sim.python))
    wrapper.chmod(0o755)
    # The launch names host2 at `ssh.hello_timeout_s` (30 s by default).
    job = RigJob(sim, workdir, "cut-launch", {"on_host_loss": "shrink"},
                 python={2: str(wrapper)}, hello_timeout_s=10)
    rigjobs.append(job)
    with cuttable(sw) as cut:
        wait_for(lambda: (gate / "agent-starting").exists() or job.proc.poll() is not None,
                 timeout=30, what="host2's agent starting")
        agent = int((gate / "agent-starting").read_text())
        cut_host(sw, cut, 2)
        (gate / "go").write_text("go")  # its hello goes nowhere
        # No word from the launcher reaches it: its lease ends it, still cut.
        wait_for(lambda: not alive([agent]), timeout=HEARTBEAT_S + 5,
                 what="host2's agent to end by its lease")
        code = job.finish(timeout=45)
        _link(sw, 2, "up")
    assert code == 2, job.output[-3000:]  # a host not reached: as at any launch
    assert re.search(r"host2: the agent on .* sent no hello within 10 s \(ssh.hello_timeout_s\)",
                     job.output), job.output
    assert not list(job.ckpt.glob("started-*")), "a task ran"
    assert not [e for e in job.events() if e["event"] == "task_started"]
    nothing_left(job)


def test_a_workers_host_cut_with_wait_rejoins_when_its_link_is_back(rig, workdir, rigjobs):
    """host1 (a worker) is cut; the launcher waits for it, trying to reconnect;
    its agent ends its task by the lease meanwhile; once its link is back the
    job resumes on all three hosts, host1's task started once per generation."""
    sw, sim = rig
    job = RigJob(sim, workdir, "cut-wait", {"on_host_loss": "wait", "host_wait_s": 30})
    rigjobs.append(job)
    with cuttable(sw) as cut:
        wait_for(lambda: len(job.saves()) >= 10, timeout=30, what="the chief saving")
        task = job.pids()[(0, "worker1")]
        agent, _ = agent_lease(job.run_name, "host1")
        cut_at = cut_host(sw, cut, 1)
        lost = job.wait_event("host_lost", timeout=HEARTBEAT_S + 10, host="host1")
        assert "no heartbeat" in lost["detail"], lost
        wait_for(lambda: not alive([task, agent]), timeout=HEARTBEAT_S + EOF_GRACE_S + 3,
                 what="host1's task and agent to end by the lease")
        waited = job.wait_event("host_wait", timeout=20, host="host1")
        assert not job.events("launch", generation=1)  # nothing without host1
        _link(sw, 1, "up")
        back = job.wait_event("host_back", timeout=20, host="host1")
        cut_s = time.monotonic() - cut_at
        code = job.finish(timeout=40)
    assert code == 0, job.output[-3000:]
    assert back["t"] > waited["t"], (waited, back)
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    relaunch = job.events("launch", generation=1)[0]
    assert sorted(t["host"] for t in relaunch["tasks"]) == ["host0", "host1", "host2"]
    assert relaunch["t"] >= back["t"]
    assert [e["host"] for e in job.events("task_started", task="worker1")] == ["host1", "host1"]
    resumed = int((job.ckpt / "restored-g1-host1").read_text())
    assert resumed == max(s[0] for s in job.saves() if s[1] == 0) > 0, resumed
    assert re.search(r"host1/worker1 +\| DONE step=", job.output), job.output[-2000:]
    assert cut_s > HEARTBEAT_S, cut_s  # the link was out while the lease ran out
    nothing_left(job)
