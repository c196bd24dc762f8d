"""Inside a Slurm allocation: one agent per node as a job step of its own.

Each agent is `srun --overlap -N1 -n1 -w NODE ... python -S -m launcher.agent`
with srun's stdin/stdout as the agent's pipe, so the supervisor sees the same
`AgentLink`s as over SSH. `--overlap` lets the agent steps share the nodes
(with each other and with anything else the job runs); without `--exact` a
step gets all the job's CPUs, memory and GPUs on its node, and the tasks the
agent starts are its children, inside that step. When a step dies (its node
failed, someone cancelled it) srun exits, the pipe ends and the host is lost.

Under `salloc` the launcher runs outside the job, and Slurm does not signal
it when the job ends (scancel, time limit): the transport asks Slurm every
second and, once the job is over, sends the launcher the SIGTERM that Slurm
sends a launcher inside the job (an sbatch script).

The code bundle is this machine's cache (`launcher.transport.shipping.install_local`),
passed on with PYTHONPATH: the nodes of a Slurm cluster share the home
directories, as in the test cluster. srun passes the launcher's environment on.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from ..spec.config import ClusterConfig
from ..spec.slurm import allocation_ended, read_allocation
from ..spec.target import HostTarget, host_run_dir
from ..spec.transports import TransportName
from . import HostProblem, every_host
from .child import DEFAULT_LEASE_S, agent_argv, start_child_agent
from .link import AgentLink, AgentMessage
from .shipping import UnsafeCache, install_local

# srun asks slurmctld for the step first: a busy controller may take a while.
HELLO_TIMEOUT_S = 60.0
ALLOCATION_POLL_S = 1.0  # under salloc: how often Slurm is asked whether the job is over


def srun_argv(job_id: str, host: HostTarget, agent_argv: Sequence[str],
              srun: str = "srun") -> list[str]:
    """The srun command line of one node's agent step."""
    return [
        srun, f"--jobid={job_id}", "--overlap", "--nodes=1", "--ntasks=1",
        f"--nodelist={host.address}",
        # One step per node: its end is that host's loss, never the job's.
        "--kill-on-bad-exit=0",
        f"--job-name=mgpu-agent-{host.name}",
        "--quiet",  # no "srun: job step ..." chatter on the agent's stderr
        "--", *agent_argv,
    ]


def from_config(config: ClusterConfig, *, checking: bool,
                lease: dict[str, float]) -> SlurmTransport:
    """`transport: slurm` (transport/factory.py): one srun step per node instead of SSH."""
    job_id = read_allocation(os.environ).job_id
    if checking:
        return SlurmTransport(job_id, require_tensorflow=False, signal_when_gone=False)
    return SlurmTransport(job_id, **lease)


class SlurmTransport:
    def __init__(self, job_id: str, *, eof_grace_s: float = 2.0,
                 lease_s: float = DEFAULT_LEASE_S, srun: str = "srun",
                 cache_root: Path | None = None, require_tensorflow: bool = True,
                 signal_when_gone: bool | None = None) -> None:
        self._job_id = job_id
        # slurmd sets SLURMD_NODENAME in the job's own processes (a batch script):
        # those get Slurm's signals; a launcher under salloc does not.
        self._signal_when_gone = ("SLURMD_NODENAME" not in os.environ
                                  if signal_when_gone is None else signal_when_gone)
        self._closed = threading.Event()
        self._watching = False
        self._eof_grace_s = eof_grace_s
        self._lease_s = lease_s
        self._srun = srun
        self._cache_root = cache_root
        self._require_tf = require_tensorflow
        self._procs: list[subprocess.Popen] = []
        self._addresses: dict[str, str] = {}  # host name -> node, for time_command
        self._lock = threading.Lock()

    def connect(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> dict[str, AgentLink]:
        return every_host(*self.connect_each(hosts, run_dir, events))

    def connect_each(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> tuple[dict[str, AgentLink], list[HostProblem]]:
        """Like `connect`, but keep the hosts that worked: (links, problems)."""
        try:
            code_dir = install_local(self._cache_root)
        except UnsafeCache as exc:  # the nodes would run the code of this very cache
            return {}, [HostProblem(host.name, str(exc)) for host in hosts]
        if self._signal_when_gone and not self._watching:
            self._watching = True
            threading.Thread(target=self._watch_allocation, daemon=True,
                             name="slurm-allocation").start()
        started: dict[str, AgentLink] = {}
        problems: list[HostProblem] = []
        for host in hosts:
            try:
                started[host.name] = self._start_agent(host, run_dir, code_dir, events)
            except OSError as exc:
                problems.append(HostProblem(host.name, f"cannot run {self._srun!r}: "
                                            f"{exc.strerror or exc}: is Slurm installed here?"))
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        links: dict[str, AgentLink] = {}
        for host in hosts:
            link = started.get(host.name)
            if link is None:
                continue
            link.hello_seen.wait(max(0.0, deadline - time.monotonic()))
            why = self._refusal(link, host)
            if why:
                link.close()
                problems.append(HostProblem(host.name, why))
            else:
                links[host.name] = link
        return links, problems

    def time_command(self, host: str, command: str = "true",
                     timeout: float = 30.0) -> float | None:
        """Seconds one command takes on `host` as a job step of its own, the
        step's start included (None when it failed or ran past `timeout`)."""
        with self._lock:
            address = self._addresses.get(host)
        if address is None:
            return None
        argv = [self._srun, f"--jobid={self._job_id}", "--overlap", "--nodes=1",
                "--ntasks=1", f"--nodelist={address}", "--quiet", "--", "/bin/sh", "-c",
                command]
        started = time.monotonic()
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return time.monotonic() - started if done.returncode == 0 else None

    def _refusal(self, link: AgentLink, host: HostTarget) -> str:
        if link.hello is None:
            return (f"the agent's job step on node {host.address} did not start: "
                    + (link.diagnostics() or f"no answer within {HELLO_TIMEOUT_S:g} s"))
        packages = link.hello.get("packages") or {}
        if self._require_tf and not packages.get("tensorflow"):
            return (f"TensorFlow is not installed for python {host.python!r} on node "
                    f"{host.address}: install it there, or set `python:`")
        return ""

    def _start_agent(self, host: HostTarget, run_dir: str, code_dir: Path,
                     events: queue.Queue[AgentMessage]) -> AgentLink:
        files = host_run_dir(run_dir, TransportName.SLURM, host.name)
        agent = agent_argv(host.python, host.name, files, self._eof_grace_s, self._lease_s)
        proc, link = start_child_agent(
            srun_argv(self._job_id, host, agent, self._srun), host.name, code_dir, events,
            eof_grace_s=self._eof_grace_s,
            describe_exit=lambda code: f"srun (node {host.address}) exited with {code}",
            # The agent ends on EOF (srun passes it on); a step that does not
            # end within the grace is cancelled: SIGTERM makes srun cancel it.
            end=_end_srun, exit_wait_s=2.0)
        with self._lock:
            self._procs.append(proc)
            self._addresses[host.name] = host.address
        return link

    def _watch_allocation(self) -> None:
        while not self._closed.wait(ALLOCATION_POLL_S):
            if allocation_ended(self._job_id):
                # The launcher's SIGTERM handler stops the job and writes its records.
                os.kill(os.getpid(), signal.SIGTERM)
                return

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            procs, self._procs = self._procs, []
        deadline = time.monotonic() + self._eof_grace_s + 5
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _end_srun(proc)


def _end_srun(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
        return
    proc.kill()
