"""Loss of a whole SSH host, for real: simulated hosts (one OpenSSH sshd per
loopback address) running a real MultiWorkerMirroredStrategy job.

A host dies the way a machine does: its sshd listener, the sshd session of
the launcher's connection, the agent under it and the training task under
the agent are all frozen, then SIGKILLed (`SimCluster.kill_host`); nobody gets
to clean up. The launcher sees the connection drop. With `on_host_loss:
shrink` the job finishes on the remaining host; with `wait` it resumes when
the host's sshd is back. As root, the same again with host1 in its own network
namespace behind a veth pair whose link is cut first: nothing tells the
launcher but the missing heartbeats. After every test no process of the job
is left on any host: no agent, no task, no sshd session.
"""

from __future__ import annotations

import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import SCRIPTS, alive, read_summary, wait_for
from tests.sshcluster import netns_available, netns_link, sim_cluster, write_yaml
from tests.test_faults import Job, training_epochs

pytestmark = pytest.mark.e2e

TRAIN = str(SCRIPTS / "fault_train.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


def job_processes(run_name: str) -> set[int]:
    """Every agent of this run on any simulated host, and everything under it.

    Found by the run's own folder on the hosts (`--run-dir
    ~/.mgpu-launch/runs/<run>-<digest>/<host>` on the agent's command line): job-scoped,
    never another test's processes.
    """
    marker = f"/.mgpu-launch/runs/{run_name}-"
    found: set[int] = set()
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if "launcher.agent" in argv and any(marker in a for a in argv):
            found.add(proc.pid)
            try:
                found.update(c.pid for c in proc.children(recursive=True))
            except psutil.Error:
                pass
    return found


class SSHJob(Job):
    """A launcher run against the simulated cluster; remembers every remote process."""

    def __init__(self, cluster, workdir: Path, name: str, restart: dict,
                 extra: list[str], ssh: dict | None = None) -> None:
        self.cluster = cluster
        self.run_name = f"{name}-{secrets.token_hex(3)}"
        config = cluster.config_dict()
        config["name"] = name
        # Each test its own checkpoints: the module's cluster is shared.
        config["checkpoint"] = {"dir": str(workdir / "checkpoints")}
        config["restart"] = {"heartbeat_timeout_s": 3, "backoff_s": 0, **restart}
        config["ssh"].update(ssh or {})
        path = write_yaml(workdir / "cluster.yaml", config)
        super().__init__([str(path), TRAIN, *extra], workdir, workdir / self.run_name)
        # The output as it comes, to wait on what the launcher tells its user.
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(timeout=10)
            raise AssertionError("launcher did not finish:\n" + "".join(self.lines)[-3000:]
                                 ) from None
        self._reader.join(timeout=10)
        self.output = "".join(self.lines)
        return self.proc.returncode

    def look(self) -> None:
        super().look()
        self.family.update(job_processes(self.run_name))

    def assert_nothing_left(self) -> None:
        super().assert_nothing_left()
        wait_for(lambda: not job_processes(self.run_name), timeout=10,
                 what="no agent of the run left on any host")
        # The launcher's SSH sessions ended too (the cluster serves one job at a time).
        hosts = range(len(self.cluster.hosts))
        wait_for(lambda: not any(self.cluster.session_pids(i) for i in hosts), timeout=10,
                 what="no sshd session left on any host")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def kill_everything(self) -> None:
        self.kill()
        for pid in alive(self.family | set(self.pids().values())
                         | job_processes(self.run_name)):
            try:
                psutil.Process(pid).send_signal(signal.SIGKILL)
            except psutil.Error:
                pass


@pytest.fixture
def jobs():
    started: list[SSHJob] = []
    yield started
    for job in started:
        job.kill_everything()  # a failed test must not leave its processes behind


def both_in_epoch(job: SSHJob, epoch: int) -> bool:
    return all(any(e.get("epoch", -1) >= epoch for e in job.events("progress", task=t))
               for t in ("worker0", "worker1"))


def kill_host_mid_training(cluster, job: SSHJob) -> list[int]:
    wait_for(lambda: both_in_epoch(job, 1), timeout=180, what="both workers in epoch 2")
    job.look()
    task = job.pids()[(0, "worker1")]
    killed = cluster.kill_host(1)
    # The whole host went: listener, session, agent and the task under it.
    assert task in killed and len(killed) >= 4, killed
    return killed


def test_lost_ssh_host_with_shrink_finishes_on_the_remaining_host(cluster, workdir, jobs):
    job = SSHJob(cluster, workdir, "ssh-shrink",
                 {"on_host_loss": "shrink", "min_workers": 1}, ["--epochs", "4"])
    jobs.append(job)
    try:
        killed = kill_host_mid_training(cluster, job)
        code = job.finish(timeout=180)
        assert not alive(killed)
        lost = job.events("host_lost")[0]
        assert lost["host"] == "host1" and "dropped" in lost["detail"], lost
        assert code == 0, job.output[-4000:]
        summary = read_summary(job.run_dir)
        assert summary["status"] == "succeeded" and summary["restarts"] >= 1, summary
        assert summary["failures"][0]["kind"] == "host_lost", summary["failures"]
        relaunch = job.events("launch", generation=1)[0]
        assert [t["host"] for t in relaunch["tasks"]] == ["host0"]
        assert "continuing without host1" in job.output
        # Resumed from the two workers' checkpoint, not from the start.
        assert min(training_epochs(job, 1)) >= 1, training_epochs(job, 1)
        assert re.search(r"^host0/worker0 +\| WEIGHTS_CHECKSUM", job.output, re.M)
        job.assert_nothing_left()
    finally:
        cluster.start_host(1)  # the next test gets both hosts


def test_lost_ssh_host_with_wait_resumes_when_its_sshd_is_back(cluster, workdir, jobs):
    job = SSHJob(cluster, workdir, "ssh-wait",
                 {"on_host_loss": "wait", "host_wait_s": 60}, ["--epochs", "4"])
    jobs.append(job)
    try:
        killed = kill_host_mid_training(cluster, job)
        lost = job.wait_event("host_lost", timeout=30, host="host1")
        assert "dropped" in lost["detail"], lost
        wait_for(lambda: not alive(killed), timeout=10, what="host1's processes to die")
        # The launcher tried host1, found it down, and keeps trying.
        wait_for(lambda: job.said("waiting up to 60 s for host host1"),
                 timeout=30, what="the launcher waiting for host1")
        cluster.start_host(1)  # the machine boots again
        back = job.wait_event("host_back", timeout=30, host="host1")
        assert back["attempts"] >= 2, back
        assert "connection refused by 127.0.0.3" in "".join(job.lines)
        assert not job.events("launch", generation=1) or \
            job.events("launch", generation=1)[0]["t"] >= back["t"]
        code = job.finish(timeout=180)
        assert code == 0, job.output[-4000:]
        summary = read_summary(job.run_dir)
        assert summary["status"] == "succeeded" and summary["restarts"] >= 1, summary
        assert summary["failures"][0]["kind"] == "host_lost", summary["failures"]
        relaunch = job.events("launch", generation=1)[0]
        assert [t["host"] for t in relaunch["tasks"]] == ["host0", "host1"]
        # Generation 1 on both hosts resumed from the checkpoint.
        assert min(training_epochs(job, 1)) >= 1, training_epochs(job, 1)
        restored = re.findall(r"^host[01]/worker[01] +\| RESTORED step=(\d+)$", job.output, re.M)
        assert len(restored) == 4 and all(int(s) >= 10 for s in restored[2:]), restored
        sums = re.findall(r"^host[01]/worker[01] +\| WEIGHTS_CHECKSUM ([0-9.]+)", job.output,
                          re.M)
        assert len(sums) == 2 and len(set(sums)) == 1, sums
        job.assert_nothing_left()
    finally:
        cluster.start_host(1)


def test_ctrl_c_while_reconnecting_to_a_hung_host_stops_at_once(cluster, workdir, jobs):
    host1 = cluster.hosts[1]
    # host1 comes back hung: something accepts TCP on its SSH port (the kernel
    # does that) and never says a word, so a reconnection attempt blocks until
    # the SSH handshake times out (15 s). Ctrl-C must not have to wait for it.
    job = SSHJob(cluster, workdir, "ssh-hung-ctrl-c",
                 {"on_host_loss": "wait", "min_workers": 1, "host_wait_s": 120},
                 ["--epochs", "40"], ssh={"connect_timeout_s": 30})
    jobs.append(job)
    mute = socket.socket()
    try:
        kill_host_mid_training(cluster, job)
        mute.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        mute.bind((host1.address, host1.port))
        mute.listen(16)
        job.wait_event("host_lost", timeout=30, host="host1")

        def handshaking_with_host1() -> bool:
            return any(c.status == psutil.CONN_ESTABLISHED and c.raddr
                       and (c.raddr.ip, c.raddr.port) == (host1.address, host1.port)
                       for c in psutil.Process(job.proc.pid).net_connections("tcp"))

        wait_for(handshaking_with_host1, timeout=30, what="the launcher stuck on host1's port")
        job.proc.send_signal(signal.SIGINT)
        code = job.finish(timeout=8)  # well under the 15 s the handshake would take
        assert code == 130, job.output[-3000:]
        assert read_summary(job.run_dir)["status"] == "interrupted"
        assert not job.events("host_back")
    finally:
        mute.close()
        cluster.start_host(1)
    job.assert_nothing_left()


# ------------------------------------------------------------- a cut network link


@pytest.fixture(scope="module")
def cut_cluster(tmp_path_factory):
    """host0 on this side of a veth pair, host1 (its sshd, agent and tasks)
    inside its own network namespace on the other: a link that can be cut."""
    why = netns_available()
    if why:  # .ci/run runs as root with iproute2: a failure to fix, not a skip
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    with netns_link() as link, sim_cluster(tmp_path_factory.mktemp("simns"), 2,
                     addresses=[link.outside, link.inside],
                     netns={1: link.netns}) as sim:
        yield sim, link


@pytest.mark.parametrize("policy", ["shrink", "wait"])
def test_host_behind_a_cut_link_is_lost_by_heartbeat(cut_cluster, workdir, jobs, policy):
    cluster, link = cut_cluster
    # connect_timeout_s: while the link is cut, each reconnection attempt times out.
    job = SSHJob(cluster, workdir, f"ssh-cut-{policy}",
                 {"on_host_loss": policy, "min_workers": 1, "host_wait_s": 60},
                 ["--epochs", "4"], ssh={"connect_timeout_s": 2})
    jobs.append(job)
    try:
        wait_for(lambda: both_in_epoch(job, 1), timeout=180, what="both workers in epoch 2")
        job.look()
        link.cut()
        killed = cluster.kill_host(1)  # and the machine dies behind the cut link
        assert job.pids()[(0, "worker1")] in killed
        # No FIN, no RST: only the missing heartbeats tell.
        lost = job.wait_event("host_lost", timeout=30, host="host1")
        assert "no heartbeat" in lost["detail"], lost
        if policy == "wait":
            wait_for(lambda: job.said("waiting up to 60 s for host host1"),
                     timeout=30, what="the launcher waiting for host1")
            link.restore()
            cluster.start_host(1)
            back = job.wait_event("host_back", timeout=30, host="host1")
            assert back["attempts"] >= 2, back
        code = job.finish(timeout=180)
        assert code == 0, job.output[-4000:]
        summary = read_summary(job.run_dir)
        assert summary["status"] == "succeeded" and summary["restarts"] >= 1, summary
        # TensorFlow's own heartbeat may notice the dead peer first; the lost
        # host is still named as the cause, never the worker that reported it.
        assert summary["failures"][0]["host"] == "host1", summary["failures"]
        relaunch = job.events("launch", generation=1)[0]
        expected = ["host0"] if policy == "shrink" else ["host0", "host1"]
        assert [t["host"] for t in relaunch["tasks"]] == expected
        assert min(training_epochs(job, 1)) >= 1, training_epochs(job, 1)
        job.assert_nothing_left()
    finally:
        link.restore()
        cluster.start_host(1)


def agent_lease(run_name: str, host: str) -> tuple[int, float]:
    """(pid, --lease) of the run's agent on `host`, read from its command line."""
    marker = re.compile(rf"/\.mgpu-launch/runs/{re.escape(run_name)}-[0-9a-f]{{8}}/{host}$")
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if "launcher.agent" in argv and any(marker.search(a) for a in argv):
            return proc.pid, float(argv[argv.index("--lease") + 1])
    raise AssertionError(f"no agent of {run_name} on {host}")


def test_a_partitioned_host_stops_its_tasks_and_the_next_generation_gets_its_ports(
        cut_cluster, workdir, jobs):
    """The host stays up behind the cut link: no EOF reaches its agent, only
    silence. Its lease runs out, it stops its task and exits; once the link is
    back the next generation starts there, on the very same ports."""
    cluster, link = cut_cluster
    job = SSHJob(cluster, workdir, "ssh-partition",
                 {"on_host_loss": "wait", "host_wait_s": 120}, ["--epochs", "4"],
                 ssh={"connect_timeout_s": 2})
    jobs.append(job)
    try:
        wait_for(lambda: both_in_epoch(job, 1), timeout=180, what="both workers in epoch 2")
        job.look()
        task = job.pids()[(0, "worker1")]
        agent, lease = agent_lease(job.run_name, "host1")
        link.cut()
        cut_at = time.monotonic()
        lost = job.wait_event("host_lost", timeout=30, host="host1")
        assert "no heartbeat" in lost["detail"], lost
        # The agent's lease, then the stop's grace (SSHTransport's eof_grace_s,
        # 2 s, and its SIGKILL): nothing of the job is left behind the cut.
        wait_for(lambda: not alive([task, agent]), timeout=lease + 2 + 5,
                 what="the partitioned host's task and agent to be gone")
        assert time.monotonic() - cut_at >= lease - 1  # its lease, not anything sooner
        link.restore()
        job.wait_event("host_back", timeout=60, host="host1")
        code = job.finish(timeout=180)
        assert code == 0, job.output[-4000:]
        summary = read_summary(job.run_dir)
        # One restart, for the lost host: generation 1 did not trip over leftovers.
        assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
        ports = [{t["task"]: (t["host"], t["port"]) for t in job.events("launch", generation=g)[0]
                  ["tasks"]} for g in (0, 1)]
        assert ports[0] == ports[1], ports
        assert min(training_epochs(job, 1)) >= 1, training_epochs(job, 1)
        job.assert_nothing_left()
    finally:
        link.restore()
