"""An agent as a child process of the launcher: its stdin and stdout are the link.

Shared by the transports that start agents as local processes: simulated hosts
(`local`: the agent itself) and Slurm (`slurm`: an `srun` job step that runs
the agent on its node and passes stdin/stdout through).

Must not import: supervisor, cli.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

from .link import AgentLink, AgentMessage

# How long an agent that hears nothing from the launcher keeps its tasks
# (the link pings every second); the launcher passes restart.heartbeat_timeout_s.
DEFAULT_LEASE_S = 10.0


def agent_argv(python: str, host: str, run_dir: str, eof_grace_s: float,
               lease_s: float) -> list[str]:
    """The agent's command line (`-S`: see launcher.agent)."""
    return [python, "-S", "-m", "launcher.agent", "--host", host, "--run-dir", run_dir,
            "--eof-grace", f"{eof_grace_s:g}", "--lease", f"{lease_s:g}"]


def start_child_agent(
    argv: Sequence[str], host: str, code_dir: Path, events: queue.Queue[AgentMessage], *,
    eof_grace_s: float, describe_exit: Callable[[int], str],
    end: Callable[[subprocess.Popen], None], exit_wait_s: float = 1.0,
) -> tuple[subprocess.Popen, AgentLink]:
    """Start `argv` with the code bundle on PYTHONPATH and link to it.

    `describe_exit(code)` words the process's exit for error messages; `end`
    ends a process that is still running a grace period after its stdin closed.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(code_dir), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, cwd=str(code_dir),
        # Own session: Ctrl-C in the terminal reaches the launcher only (which
        # stops the tasks first; srun, say, would cancel its step at once).
        start_new_session=True,
    )
    stderr_tail: deque[str] = deque(maxlen=20)

    def drain_stderr() -> None:
        for raw in iter(proc.stderr.readline, b""):
            stderr_tail.append(raw.decode("utf-8", "replace").rstrip())

    threading.Thread(target=drain_stderr, daemon=True, name=f"stderr-{host}").start()

    def diagnostics() -> str:
        try:
            code = proc.wait(timeout=exit_wait_s)  # the pipe closed; the exit follows
        except subprocess.TimeoutExpired:
            code = None
        detail = " | ".join(list(stderr_tail)[-3:])
        if code is None:
            return detail
        return describe_exit(code) + (f": {detail}" if detail else "")

    def on_close() -> None:
        # A stuck (e.g. SIGSTOPped) agent cannot act on EOF: end it once the
        # grace has passed; its tasks follow through PR_SET_PDEATHSIG.
        timer = threading.Timer(eof_grace_s + 3.0, end, args=(proc,))
        timer.daemon = True
        timer.start()

    link = AgentLink(host, proc.stdin, proc.stdout, events, on_close=on_close,
                     diagnostics=diagnostics)
    link.start_reading()
    return proc, link


def kill_if_running(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
