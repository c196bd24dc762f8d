"""The job's firewall for real: simulated SSH hosts, each in its own network
namespace on one switch (a Linux bridge), and an outsider namespace on the
same switch. While the job trains, the outsider cannot open a connection to a
worker's TensorFlow port (the other host can, and the outsider still reaches
the host's sshd), nor can another local user of the worker's own host (the
job's user can); the job trains to the end; the rules are gone after the job,
after a launcher SIGKILL, and after a killed agent is replaced; two jobs at
once keep to their own tables.

Every namespace, link and address is this module's own (`fw*` names, a
10.214.N.0/24 no interface here uses) and is removed afterwards.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.tools import netsim
from launcher.tools.netsim import Switch
from tests.conftest import alive, read_summary, start_cli, wait_for
from tests.sshcluster import netns_available, sim_cluster, write_yaml
from tests.test_faults_ssh import job_processes

pytestmark = pytest.mark.e2e

# MWMS training that pauses once, mid-training, until the test says go: each
# worker writes `ready-<host>` after its first epoch and waits (bounded) for `go`.
GATED_TRAIN = """\
import hashlib, os, pathlib, sys, time
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np
import tensorflow as tf
from launcher import runtime

gate = pathlib.Path(sys.argv[1])
strategy = runtime.strategy()
tf.keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x @ np.array([1.0, -2.0, 3.0, 0.5], dtype="float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8 * strategy.num_replicas_in_sync)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = data.with_options(options)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
(gate / ("ready-" + os.environ["MGPU_HOST"])).write_text("ready")
deadline = time.monotonic() + 120
while not (gate / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
model.fit(data, epochs=1, steps_per_epoch=2, verbose=0)
weights = np.concatenate([w.numpy().ravel() for w in model.weights])
print("weights digest", hashlib.sha256(weights.tobytes()).hexdigest()[:16], flush=True)
"""

# Not TensorFlow (seconds less per task): a task that listens on its TF_CONFIG
# port as a TF server would, with the same gate.
GATED_LISTEN = """\
import json, os, pathlib, socket, sys, time
gate = pathlib.Path(sys.argv[1])
tf = json.loads(os.environ["TF_CONFIG"])
port = int(tf["cluster"][tf["task"]["type"]][tf["task"]["index"]].rsplit(":", 1)[1])
server = socket.create_server(("", port), reuse_port=False)
(gate / ("ready-" + os.environ["MGPU_HOST"])).write_text("ready")
deadline = time.monotonic() + 120
while not (gate / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("served", port, flush=True)
"""


# GATED_LISTEN, and a server of the script's own on a port TF_CONFIG does not name.
GATED_OWN_PORT = GATED_LISTEN.replace(
    "(gate / (\"ready-\"", "own = socket.create_server((\"\", 0))\n"
    "(gate / (\"port-\" + os.environ[\"MGPU_HOST\"])).write_text(str(own.getsockname()[1]))\n"
    "(gate / (\"ready-\"", 1)


def switch(count: int) -> contextlib.AbstractContextManager[Switch]:
    """`count` host namespaces and an outsider on one bridge (launcher/tools/netsim.py,
    as `mgpu-launch simulate --netns` makes them); removed on the way out."""
    return netsim.switch(count, outsider=True, label="firewall")


def connects(netns: str, address: str, port: int, timeout: float = 1.0,
             as_nobody: bool = False) -> bool:
    """Whether a TCP connection from `netns` to address:port opens within
    `timeout` (a dropped SYN is never answered: the bound is the answer);
    `as_nobody`: from a process of another user than the job's (root's)."""
    code = ("import socket\n"
            "try:\n"
            f"    socket.create_connection(({address!r}, {port}), timeout={timeout}).close()\n"
            "    print('connected')\n"
            "except OSError:\n"
            "    print('not connected')\n")
    user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
            "/usr/bin/python3"] if as_nobody else [sys.executable]  # the venv: maybe root's
    done = subprocess.run(["ip", "netns", "exec", netns, *user, "-c", code],
                          capture_output=True, text=True, timeout=timeout + 30)
    assert done.stdout.strip() in ("connected", "not connected"), done.stderr  # it ran
    return done.stdout.strip() == "connected"


def tables(netns: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "tables"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if "mgpu_" in line)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    why = netns_available()
    if why:  # .ci/run runs as root with iproute2: a failure to fix, not a skip
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    with switch(2) as sw, sim_cluster(tmp_path_factory.mktemp("simfw"), 2,
                                      addresses=[a for _, a in sw.hosts],
                                      netns={i: n for i, (n, _) in enumerate(sw.hosts)}) as sim:
        yield sw, sim


class FwJob:
    """A launcher run of GATED_TRAIN on the namespaced cluster."""

    def __init__(self, net, workdir: Path, name: str, port_base: int | None = None,
                 verbose: bool = False, script: str = GATED_LISTEN) -> None:
        sw, sim = net
        self.sw, self.sim = sw, sim
        self.run_name = f"{name}-{secrets.token_hex(3)}"
        self.gate = workdir / f"gate-{self.run_name}"
        self.gate.mkdir()
        path = workdir / f"gated-{self.run_name}.py"
        path.write_text(script)
        config = sim.config_dict()
        config["name"] = name
        config["checkpoint"] = {"dir": str(workdir / f"ckpt-{self.run_name}")}
        # No warm standbys: each would import TensorFlow on a machine of 2 cores.
        config["restart"] = {"heartbeat_timeout_s": 3, "backoff_s": 0, "warm_standby": "off"}
        config["security"] = {"tf_ports": "cluster"}
        if port_base is not None:
            config["ports"] = {"base": port_base}
        self.port_base = config["ports"]["base"]
        yaml_path = write_yaml(workdir / f"{self.run_name}.yaml", config)
        self.run_dir = workdir / self.run_name
        self.proc = start_cli([*(["-v"] if verbose else []), "--run-dir", str(self.run_dir),
                               str(yaml_path), str(path), str(self.gate)], cwd=workdir)

    def ready(self) -> bool:
        return all((self.gate / f"ready-{h.name}").exists() for h in self.sim.hosts)

    def wait_ready(self) -> None:
        wait_for(lambda: self.ready() or self.proc.poll() is not None, timeout=180,
                 what="both workers in training")
        assert self.proc.poll() is None, self.proc.communicate()[0][-4000:]

    def go(self) -> None:
        (self.gate / "go").write_text("go")

    def finish(self, timeout: float = 180) -> str:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError("launcher did not finish:\n" + out[-3000:]) from None
        assert self.proc.returncode == 0, out[-4000:]
        return out

    def kill_everything(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pid in alive(job_processes(self.run_name)):
            try:
                subprocess.run(["kill", "-9", str(pid)], capture_output=True)
            except OSError:
                pass


@pytest.fixture
def fwjobs():
    started: list[FwJob] = []
    yield started
    for job in started:
        job.kill_everything()


def test_an_outsider_cannot_reach_a_workers_port_while_the_job_trains_to_the_end(
        net, tmp_path, fwjobs):
    sw, sim = net
    job = FwJob(net, tmp_path, "fw-seal", script=GATED_TRAIN)
    fwjobs.append(job)
    job.wait_ready()
    (ns0, addr0), (ns1, addr1) = sw.hosts
    outsider = sw.outsider[0]
    port0 = job.port_base  # host0/worker0 (ports are given in task order)
    assert len(tables(ns0)) == 1 and len(tables(ns1)) == 1
    assert not connects(outsider, addr0, port0)  # the worker's TF server: dropped
    assert not connects(outsider, addr1, port0 + 1)
    assert connects(ns1, addr0, port0)  # the other host of the job: admitted
    assert connects(outsider, addr0, sim.hosts[0].port)  # sshd: not the job's port
    # Another user of the job's own host: refused over loopback and to the host's
    # address; a process of the job's user (root here) connects.
    for address in ("127.0.0.1", addr0):
        assert not connects(ns0, address, port0, as_nobody=True)
        assert connects(ns0, address, port0)
    assert connects(ns0, addr0, sim.hosts[0].port, as_nobody=True)  # sshd: untouched
    job.go()
    out = job.finish()
    digests = {line.split()[-1] for line in out.splitlines() if "weights digest" in line}
    assert len(digests) == 1, out[-3000:]  # both workers trained to the same weights
    assert read_summary(job.run_dir)["status"] == "succeeded"
    # Removed as each agent exits (started, not waited for: the kernel's time).
    wait_for(lambda: tables(ns0) == [] and tables(ns1) == [], timeout=10, what="rules removed")


def test_another_user_of_one_host_is_refused_the_tf_ports_of_every_host(net, tmp_path, fwjobs):
    """The host's address is admitted whole on its peers: the host itself keeps
    its other users off every host's task ports, before their SYN leaves."""
    sw, sim = net
    job = FwJob(net, tmp_path, "fw-peer")
    fwjobs.append(job)
    job.wait_ready()
    (ns0, addr0), (ns1, addr1) = sw.hosts
    port0, port1 = job.port_base, job.port_base + 1  # host0's task, host1's
    assert not connects(ns0, addr1, port1, as_nobody=True)  # h1's nobody to h2's TF port
    assert not connects(ns1, addr0, port0, as_nobody=True)
    assert connects(ns0, addr1, port1)  # the job's user (root here)
    assert not connects(sw.outsider[0], addr1, port1)  # not a host of the job: dropped
    assert connects(ns0, addr1, sim.hosts[1].port, as_nobody=True)  # the peer's sshd: untouched
    job.go()
    assert "served" in job.finish()
    wait_for(lambda: tables(ns0) == [] and tables(ns1) == [], timeout=10, what="rules removed")


def sealed_set(netns: str, set_name: str) -> str:
    """The elements of the job's table's set in `netns` (one job there)."""
    table = tables(netns)[0]
    return subprocess.run(["ip", "netns", "exec", netns, "nft", "list", "set", "inet", table,
                           set_name], capture_output=True, text=True, check=True).stdout


def test_a_port_the_script_opens_itself_is_sealed_on_every_host(net, tmp_path, fwjobs):
    """Found as it opens (the agent polls its tasks' listening sockets), sealed
    on its host as the TF ports, and told the other hosts (their other users)."""
    sw, sim = net
    job = FwJob(net, tmp_path, "fw-own", script=GATED_OWN_PORT)
    fwjobs.append(job)
    job.wait_ready()
    (ns0, addr0), (ns1, addr1) = sw.hosts
    own = int((job.gate / f"port-{sim.hosts[1].name}").read_text())  # on host1
    wait_for(lambda: f" {own}" in sealed_set(ns1, "ports")
             and f"{addr1} . {own}" in sealed_set(ns0, "cluster4"), timeout=10,
             what="the script's own port sealed on its host and told the other")
    assert not connects(ns0, addr1, own, as_nobody=True)  # another user of the other host
    for address in ("127.0.0.1", addr1):  # another user of its own host
        assert not connects(ns1, address, own, as_nobody=True)
    assert not connects(sw.outsider[0], addr1, own)  # not a host of the job: dropped
    assert connects(ns0, addr1, own)  # the job's user (root here), from the other host
    assert connects(ns1, "127.0.0.1", own)
    job.go()
    assert "served" in job.finish()
    wait_for(lambda: tables(ns0) == [] and tables(ns1) == [], timeout=10, what="rules removed")


def test_the_rules_go_when_the_launcher_is_killed(net, tmp_path, fwjobs):
    sw, _ = net
    job = FwJob(net, tmp_path, "fw-kill")
    fwjobs.append(job)
    job.wait_ready()
    namespaces = [ns for ns, _ in sw.hosts]
    assert all(len(tables(ns)) == 1 for ns in namespaces)
    job.proc.send_signal(signal.SIGKILL)
    job.proc.communicate()
    # The agents notice (their SSH session closes, or the lease of 3 s runs out),
    # stop their tasks and remove the rules.
    wait_for(lambda: not any(tables(ns) for ns in namespaces), timeout=30,
             what="every host's rules removed after the launcher died")
    wait_for(lambda: not job_processes(job.run_name), timeout=30, what="no agent left")


def test_a_killed_agents_rules_are_reaped_by_the_next_agent(net, tmp_path, fwjobs):
    sw, sim = net
    job = FwJob(net, tmp_path, "fw-agent", verbose=True)  # -v: the agents' log lines
    fwjobs.append(job)
    job.wait_ready()
    ns1, addr1 = sw.hosts[1]
    before = tables(ns1)
    agent = next(p for p in job_processes(job.run_name)
                 if "launcher.agent" in _argv(p) and "host1" in _argv(p))
    subprocess.run(["kill", "-9", str(agent)], check=True)
    # The host is lost and comes back: a new agent of the same run directory
    # removes the old rules before any task starts, then seals the new generation.
    job.go()
    out = job.finish(timeout=240)
    assert "removed the firewall rules (table inet " + before[0] in out, out[-4000:]
    wait_for(lambda: tables(ns1) == [] and tables(sw.hosts[0][0]) == [], timeout=10,
             what="rules removed")


def _argv(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except OSError:
        return []


def test_two_jobs_at_once_keep_to_their_own_rules(net, tmp_path, fwjobs):
    sw, sim = net
    first = FwJob(net, tmp_path, "fw-one")
    second = FwJob(net, tmp_path, "fw-two", port_base=first.port_base + 10)
    fwjobs += [first, second]
    first.wait_ready()
    second.wait_ready()
    ns0, addr0 = sw.hosts[0]
    assert len(tables(ns0)) == 2  # one table per job
    first.go()
    first.finish()
    # The first job's rules went, the second's stay, and keep its port sealed.
    wait_for(lambda: len(tables(ns0)) == 1, timeout=10, what="the first job's rules removed")
    assert not connects(sw.outsider[0], addr0, second.port_base)
    assert connects(sw.hosts[1][0], addr0, second.port_base)
    second.go()
    second.finish()
    wait_for(lambda: tables(ns0) == [] and tables(sw.hosts[1][0]) == [], timeout=10,
             what="rules removed")
