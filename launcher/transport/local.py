"""Simulated hosts: one agent per host as a plain subprocess of the launcher.

The agent runs from the same cached bundle the SSH transport uploads, with the
host's configured Python, so a job that works here exercises the same agent,
bootstrap and runtime code that runs on real hosts.
"""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from ..spec.config import ClusterConfig
from ..spec.target import HostTarget, host_run_dir
from ..spec.transports import TransportName
from . import HostProblem, every_host
from .child import DEFAULT_LEASE_S, agent_argv, kill_if_running, start_child_agent
from .link import AgentLink, AgentMessage
from .shipping import UnsafeCache, install_local

HELLO_TIMEOUT_S = 30.0  # a cold Python start on a loaded machine; no TF import involved


def from_config(config: ClusterConfig, *, checking: bool,
                lease: dict[str, float]) -> LocalTransport:
    """`transport: local` (transport/factory.py): simulated hosts on this machine."""
    return LocalTransport(**lease)


class LocalTransport:
    def __init__(self, cache_root: Path | None = None, eof_grace_s: float = 2.0,
                 lease_s: float = DEFAULT_LEASE_S) -> None:
        self._cache_root = cache_root
        self._eof_grace_s = eof_grace_s
        self._lease_s = lease_s
        self._procs: list[subprocess.Popen] = []

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
        except UnsafeCache as exc:  # every host would run the code of this very cache
            return {}, [HostProblem(host.name, str(exc)) for host in hosts]
        started: dict[str, AgentLink] = {}
        problems: list[HostProblem] = []
        for host in hosts:
            try:
                started[host.name] = self._start_agent(host, run_dir, code_dir, events)
            except OSError as exc:
                problems.append(HostProblem(host.name, f"cannot start {host.python!r}: "
                                            f"{exc.strerror or exc}; set `python:` to an "
                                            "interpreter that exists on this machine"))
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        links: dict[str, AgentLink] = {}
        for name, link in started.items():
            link.hello_seen.wait(max(0.0, deadline - time.monotonic()))
            if link.hello is None:
                link.close()
                problems.append(HostProblem(name, "agent did not start: " +
                                            (link.diagnostics() or "no answer")))
            else:
                links[name] = link
        return links, problems

    def time_command(self, host: str, command: str = "true",
                     timeout: float = 30.0) -> float | None:
        """Seconds one shell command takes on this machine, where every
        simulated host runs (None when it failed or ran past `timeout`)."""
        started = time.monotonic()
        try:
            done = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return time.monotonic() - started if done.returncode == 0 else None

    def _start_agent(self, host: HostTarget, run_dir: str, code_dir: Path,
                     events: queue.Queue[AgentMessage]) -> AgentLink:
        files = host_run_dir(run_dir, TransportName.LOCAL, host.name)
        argv = agent_argv(host.python, host.name, files, self._eof_grace_s, self._lease_s)
        proc, link = start_child_agent(
            argv, host.name, code_dir, events, eof_grace_s=self._eof_grace_s,
            describe_exit=lambda code: f"agent exited with {code}", end=kill_if_running)
        self._procs.append(proc)
        return link

    def close(self) -> None:
        for proc in self._procs:
            try:
                proc.wait(timeout=self._eof_grace_s + 5)
            except subprocess.TimeoutExpired:
                proc.kill()


