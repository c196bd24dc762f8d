"""A real Slurm cluster on this one machine, for tests: munged, slurmctld and
one slurmd per node (`slurmd -N nodeK`), all from a private `SLURM_CONF` and
state directory under a fresh folder in /tmp.

Nodes run on loopback: each has `NodeHostname=localhost`, `NodeAddr=127.0.0.1`
and its own `Port=`. The only change outside the folder is one line in
/etc/hosts (`127.0.0.1 node1 node2 ...`, tagged) so that the node names resolve,
as TF_CONFIG addresses must; it is removed at the end. Needs root (SlurmUser=root)
and Debian's `slurm-wlm` and `munge` packages.

Test modules build a module-scoped fixture from `slurm_cluster(...)`; jobs are
submitted with the real `salloc`/`srun`/`sbatch` and `env()` (SLURM_CONF set).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HOSTS_FILE = Path("/etc/hosts")
DAEMONS = ("munged", "slurmctld", "slurmd", "salloc", "srun", "sbatch", "scontrol")

SLURM_CONF = """\
ClusterName=mgpu{tag}
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
PlugStackConfig={root}/plugstack.conf
# No cgroups in this container: track processes by parent, bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
KillWait=5
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def unavailable() -> str:
    """"" when a test cluster can run here, else why not (what to install)."""
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (SlurmUser=root)"
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        return (f"Slurm not installed ({', '.join(missing)} missing): "
                "apt-get install slurm-wlm munge")
    return ""


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    nodes: list[str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    hosts_line: str = ""

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        for key in [k for k in env if k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))]:
            del env[key]  # nothing of an outer allocation may leak in
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, argv: list[str], timeout: float = 60, **env: str
            ) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(**env), capture_output=True, text=True,
                              timeout=timeout)

    def idle_nodes(self) -> list[str]:
        done = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=20)
        return [line.split()[0] for line in done.stdout.splitlines()
                if line.split()[1:] == ["idle"]]

    def jobs(self) -> list[str]:
        done = self.run(["squeue", "-h", "-o", "%i"], timeout=20)
        return done.stdout.split()

    def log(self, name: str) -> str:
        path = self.root / "log" / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.jobs():
                self.run(["scancel", "--user", "root"], timeout=20)
                _wait(lambda: not self.jobs(), 30)
        for proc in reversed(self.procs):  # slurmds, then slurmctld, then munged
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        # slurmstepd and the tasks of a step outlive slurmd: every process
        # started for this cluster carries its SLURM_CONF in its environment.
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("SLURM_CONF") == str(self.conf) and proc.pid != os.getpid():
                    proc.kill()
        _remove_hosts_line(self.hosts_line)
        shutil.rmtree(self.root, ignore_errors=True)


def _wait(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def _add_hosts_line(line: str) -> None:
    text = HOSTS_FILE.read_text()
    HOSTS_FILE.write_text(text + ("" if text.endswith("\n") or not text else "\n") + line + "\n")


def _remove_hosts_line(line: str) -> None:
    if not line:
        return
    with contextlib.suppress(OSError):
        lines = HOSTS_FILE.read_text().splitlines(keepends=True)
        HOSTS_FILE.write_text("".join(x for x in lines if x.rstrip("\n") != line))


def start_cluster(count: int = 2) -> SlurmCluster:
    """Start munged, slurmctld and `count` slurmds (node1..nodeN); wait until idle."""
    tag = secrets.token_hex(3)
    # munged wants every folder above its socket searchable by all (pytest's
    # tmp_path is 0700), hence a folder of its own right under /tmp.
    root = Path(tempfile.mkdtemp(prefix=f"mgpu-slurm-{tag}-", dir="/tmp"))
    root.chmod(0o755)
    for sub in ("munge", "state", "run", "log", "spool"):
        (root / sub).mkdir(mode=0o755)
    (root / "key").mkdir(mode=0o700)
    key = root / "key" / "munge.key"
    key.write_bytes(secrets.token_bytes(128))
    key.chmod(0o600)
    (root / "plugstack.conf").write_text("")  # not the system's /etc/slurm one
    nodes = [f"node{i + 1}" for i in range(count)]
    ports = _free_ports(count + 1)
    cpus = os.cpu_count() or 2
    node_lines = "\n".join(
        f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={cpus} RealMemory=1000" for name, port in zip(nodes, ports[1:], strict=True))
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(tag=tag, root=root, ctld_port=ports[0], nodes=node_lines,
                                      node_names=",".join(nodes)))
    cluster = SlurmCluster(root=root, conf=conf, nodes=nodes)
    env = cluster.env()
    try:
        cluster.hosts_line = f"127.0.0.1 {' '.join(nodes)}  # mgpu-launch slurm test {tag}"
        _add_hosts_line(cluster.hosts_line)
        log = open(root / "log" / "daemons.out", "ab")  # noqa: SIM115 - kept for the daemons
        socket_path = root / "munge" / "munge.socket"
        cluster.procs.append(subprocess.Popen(
            ["munged", "-F", f"--socket={socket_path}", f"--key-file={key}",
             f"--log-file={root / 'log' / 'munged.log'}", f"--pid-file={root / 'run/munged.pid'}",
             f"--seed-file={root / 'run' / 'munged.seed'}"],
            env=env, stdout=log, stderr=log, start_new_session=True))
        if not _wait(socket_path.exists, 20):
            raise RuntimeError(f"munged did not start: {cluster.log('munged.log')[-2000:]}")
        cluster.procs.append(subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=log, stderr=log,
            start_new_session=True))
        for name in nodes:
            cluster.procs.append(subprocess.Popen(
                ["slurmd", "-D", "-f", str(conf), "-N", name], env=env, stdout=log, stderr=log,
                start_new_session=True))
        if not _wait(lambda: sorted(cluster.idle_nodes()) == nodes, 60, 0.3):
            raise RuntimeError("Slurm nodes not idle within 60 s:\n"
                               + cluster.log("slurmctld.log")[-2000:]
                               + (root / "log" / "daemons.out").read_text()[-2000:])
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def slurm_cluster(count: int = 2) -> Iterator[SlurmCluster]:
    cluster = start_cluster(count)
    try:
        yield cluster
    finally:
        cluster.stop()
