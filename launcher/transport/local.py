"""Simulated hosts: one agent per host as a plain subprocess of the launcher.

The agent runs from the same cached bundle the SSH transport uploads, with the
host's configured Python, so a job that works here exercises the same agent,
bootstrap and runtime code that runs on real hosts.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from ..plan import HostTarget, host_run_dir
from ..shipping import install_local
from . import HostProblem, TransportError
from .link import AgentLink, AgentMessage

HELLO_TIMEOUT_S = 30.0  # a cold Python start on a loaded machine; no TF import involved
# How long an agent that hears nothing from the launcher keeps its tasks
# (the link pings every second); the launcher passes restart.heartbeat_timeout_s.
DEFAULT_LEASE_S = 10.0


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
        code_dir = install_local(self._cache_root)
        links: dict[str, AgentLink] = {}
        problems: list[HostProblem] = []
        for host in hosts:
            try:
                links[host.name] = self._start_agent(host, run_dir, code_dir, events)
            except OSError as exc:
                problems.append(HostProblem(host.name, f"cannot start {host.python!r}: "
                                            f"{exc.strerror or exc}; set `python:` to an "
                                            "interpreter that exists on this machine"))
        deadline = time.monotonic() + HELLO_TIMEOUT_S
        for name, link in links.items():
            link.hello_seen.wait(max(0.0, deadline - time.monotonic()))
            if link.hello is None:
                problems.append(HostProblem(name, "agent did not start: " +
                                            (link.diagnostics() or "no answer")))
        if problems:
            for link in links.values():
                link.close()
            raise TransportError(problems)
        return links

    def _start_agent(self, host: HostTarget, run_dir: str, code_dir: Path,
                     events: queue.Queue[AgentMessage]) -> AgentLink:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code_dir), env.get("PYTHONPATH")) if p)
        argv = [host.python, "-S", "-m", "launcher.agent",  # -S: see launcher.agent
                "--host", host.name,
                "--run-dir", host_run_dir(run_dir, "local", host.name),
                "--eof-grace", str(self._eof_grace_s), "--lease", str(self._lease_s)]
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=str(code_dir),
            # Own session: Ctrl-C in the terminal reaches the launcher only.
            start_new_session=True,
        )
        self._procs.append(proc)
        stderr_tail: deque[str] = deque(maxlen=20)

        def drain_stderr() -> None:
            for raw in iter(proc.stderr.readline, b""):
                stderr_tail.append(raw.decode("utf-8", "replace").rstrip())

        threading.Thread(target=drain_stderr, daemon=True).start()

        def diagnostics() -> str:
            try:
                code = proc.wait(timeout=1.0)  # the pipe closed; the exit follows
            except subprocess.TimeoutExpired:
                code = None
            detail = " | ".join(list(stderr_tail)[-3:])
            return f"agent exited with {code}: {detail}" if code is not None else detail

        def on_close() -> None:
            # A stuck (e.g. SIGSTOPped) agent cannot act on EOF: kill it once the
            # grace has passed; its tasks follow through PR_SET_PDEATHSIG.
            timer = threading.Timer(self._eof_grace_s + 3.0, _kill_if_running, args=(proc,))
            timer.daemon = True
            timer.start()

        link = AgentLink(host.name, proc.stdin, proc.stdout, events, on_close=on_close,
                         diagnostics=diagnostics)
        link.start_reading()
        return link

    def close(self) -> None:
        for proc in self._procs:
            try:
                proc.wait(timeout=self._eof_grace_s + 5)
            except subprocess.TimeoutExpired:
                proc.kill()



def _kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
