"""The agent's lease and the reaping of leftovers, with real processes and signals.

- An agent whose stdin stays open but silent (a launcher behind a partition:
  no EOF ever comes) stops its tasks and exits once its lease runs out; pings
  from a real `AgentLink` keep it alive.
- A new agent with the same run directory kills what an earlier agent left
  behind before it starts anything, and never a process whose pid merely
  matches (pid reuse).
"""

from __future__ import annotations

import io
import json
import os
import queue
import signal
import subprocess
import sys
import time

import psutil

from launcher.agent.lease import EXIT_LEASE
from launcher.spec.plan import HostTarget
from launcher.transport.link import AgentLink
from launcher.transport.local import LocalTransport
from launcher.transport.sshbundle import agent_command
from tests.agentproc import AgentProc, agent_env
from tests.conftest import alive, wait_for

# A task and a child in its process group; both print their pids.
FAMILY = """\
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print("family", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""


def family(agent: AgentProc, name: str = "worker0") -> tuple[int, int]:
    agent.start_task(name, [sys.executable, "-c", FAMILY])
    line = wait_for(lambda: [t for t in agent.output(name) if t.startswith("family")],
                    timeout=30, what="the task's pids")
    _, task, child = line[0].split()  # type: ignore[index]
    return int(task), int(child)


def kill_quietly(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_a_silent_launcher_makes_the_agent_stop_its_tasks_and_exit(tmp_path):
    lease, grace = 2.0, 0.5
    agent = AgentProc(tmp_path / "run", lease_s=lease, eof_grace_s=grace)
    pids: tuple[int, int] = (0, 0)
    try:
        assert agent.hello()["lease_s"] == lease
        before = time.monotonic()  # the start command is the last thing it hears
        pids = family(agent)
        # stdin stays open: no EOF, only silence. Its exit code and log line say
        # the lease ended it; the bound is for a starved machine, not a speed target.
        code = agent.proc.wait(timeout=lease + grace + 30)
        took = time.monotonic() - before
        assert code == EXIT_LEASE, agent.proc.stderr.read() if agent.proc.stderr else ""
        assert not alive(pids), pids
        assert took >= lease, took  # never before the lease ran out
        # The agent is gone, its last lines may still be on their way to our reader.
        wait_for(lambda: any("nothing from the launcher" in m["text"]
                             for m in agent.events("log")),
                 timeout=30, what=f"the lease's log line; got {agent.messages[-5:]}")
        exited = agent.wait_event("exited", task="worker0")
        assert exited["stopping"] is True, exited
    finally:
        kill_quietly(pids)
        agent.close()


def test_pings_from_the_link_keep_the_lease(tmp_path):
    lease = 1.5
    agent = AgentProc(tmp_path / "run", lease_s=lease)
    # The launcher's side as the transports build it: the link pings when idle.
    events: queue.Queue = queue.Queue()
    nothing = io.BytesIO()  # the agent's replies are read by AgentProc
    link = AgentLink("h1", agent.proc.stdin, nothing, events, ping_every_s=0.3)
    pids: tuple[int, int] = (0, 0)
    try:
        agent.hello()
        assert link.send({"op": "start", "task": "worker0", "generation": 0,
                          "argv": [sys.executable, "-c", FAMILY], "env": {},
                          "tf_config": "{}", "cwd": str(tmp_path)})
        line = wait_for(lambda: [t for t in agent.output("worker0") if t.startswith("family")],
                        timeout=30, what="the task's pids")
        pids = tuple(int(p) for p in line[0].split()[1:])  # type: ignore[index,assignment]
        # Heartbeats come once a second: three leases' worth of them.
        count = len(agent.events("heartbeat"))
        wait_for(lambda: len(agent.events("heartbeat")) >= count + 3 * lease + 1, timeout=20,
                 what="heartbeats for three leases")
        assert agent.proc.poll() is None and alive(pids) == list(pids)
        link.close()  # EOF: the usual way out
        assert agent.proc.wait(timeout=10) == 0
        assert not alive(pids)
    finally:
        kill_quietly(pids)
        agent.close()


def test_a_new_agent_reaps_what_a_killed_agent_left_behind(tmp_path):
    first = AgentProc(tmp_path / "run")
    second = None
    pids: tuple[int, int] = (0, 0)
    try:
        first.hello()
        task, child = pids = family(first)
        records = list((tmp_path / "run" / "pids").glob("worker0-*.json"))
        assert len(records) == 1 and records[0].stat().st_mode & 0o777 == 0o600
        assert json.loads(records[0].read_text())["pid"] == task
        # SIGKILL: the agent cleans nothing up. PR_SET_PDEATHSIG takes the task
        # itself; its child, in the task's process group, is left behind.
        first.proc.kill()
        first.proc.wait()
        wait_for(lambda: not alive([task]), timeout=30, what="the task to die with its agent")
        assert alive([child]) == [child], "the child was meant to survive its agent"
        second = AgentProc(tmp_path / "run")
        hello = second.hello()
        assert [r["task"] for r in hello["reaped"]] == ["worker0"], hello["reaped"]
        assert hello["reaped"][0]["pids"] == [child]
        assert not alive([child])
        # The log line comes after the hello (the SSH transport skips lines before it).
        wait_for(lambda: any("killed leftover task worker0" in m["text"]
                             for m in second.events("log")),
                 timeout=30, what="the agent's log line about the leftover")
        assert not list((tmp_path / "run" / "pids").glob("*.json"))
    finally:
        kill_quietly(pids)
        first.close()
        if second is not None:
            second.close()


def test_a_new_agent_reaps_the_tasks_of_a_frozen_agent(tmp_path):
    # The agent is alive but hears and does nothing (SIGSTOP: as good as cut
    # off before its lease runs out): its whole task, leader included, goes.
    first = AgentProc(tmp_path / "run")
    second = None
    pids: tuple[int, int] = (0, 0)
    try:
        first.hello()
        pids = family(first)
        os.kill(first.proc.pid, signal.SIGSTOP)
        second = AgentProc(tmp_path / "run")
        reaped = second.hello()["reaped"]
        assert sorted(reaped[0]["pids"]) == sorted(pids), reaped
        assert not alive(pids)
        # Its own task starts afterwards, on a clean slate.
        second.start_task("worker0", [sys.executable, "-c", "print('fresh')"])
        second.wait_event("exited", task="worker0")
    finally:
        kill_quietly(pids)
        kill_quietly([first.proc.pid])
        first.close()
        if second is not None:
            second.close()


def test_a_reused_pid_is_never_killed(tmp_path):
    # A pid file naming a live process that is not the task (pid reused since):
    # wrong start time, no token in its environment.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    agent = None
    try:
        folder = tmp_path / "run" / "pids"
        folder.mkdir(parents=True)
        (folder / "worker0-00112233.json").write_text(json.dumps(
            {"task": "worker0", "generation": 0, "pid": stranger.pid, "start": 1,
             "token": "0011223344556677", "agent_pid": 1}))
        (folder / "junk.json").write_text("{not json")
        agent = AgentProc(tmp_path / "run")
        assert agent.hello()["reaped"] == []
        assert alive([stranger.pid]) == [stranger.pid]
        assert not list(folder.glob("*.json"))  # stale records are cleared
    finally:
        stranger.kill()
        stranger.wait()
        if agent is not None:
            agent.close()


class CountingPipe:
    """The agent's stdin, counting the pings written to it."""

    def __init__(self, pipe) -> None:
        self.pipe = pipe
        self.pings = 0

    def write(self, data: bytes) -> int:
        self.pings += data == b'{"op":"ping"}\n'
        return self.pipe.write(data)

    def flush(self) -> None:
        self.pipe.flush()

    def close(self) -> None:
        self.pipe.close()


def test_a_launcher_slow_to_read_still_keeps_the_lease(tmp_path):
    # Nobody reads the agent's stdout: its writes block (as behind a full SSH
    # window), and with them whatever command is being answered. The pings
    # still arrive, so the lease holds.
    lease = 1.0
    chatty = "import sys\nwhile True:\n    sys.stdout.write('x' * 1000 + '\\n')\n"
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", "launcher.agent", "--host", "h1", "--run-dir",
         str(tmp_path / "run"), "--eof-grace", "0.5", "--lease", str(lease)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=agent_env(),
        start_new_session=True)
    stdin = CountingPipe(proc.stdin)
    link = AgentLink("h1", stdin, io.BytesIO(), queue.Queue(), ping_every_s=0.2)
    try:
        link.send({"op": "start", "task": "w", "argv": [sys.executable, "-c", chatty],
                   "env": {}, "tf_config": "{}"})
        wait_for(lambda: task_of(proc.pid), timeout=30, what="the task")
        task = task_of(proc.pid)
        # A command to answer: the answer cannot be written, the command waits.
        link.send({"op": "stacks", "tasks": ["nobody"]})
        wait_for(lambda: stdin.pings >= 5 * lease / 0.2, timeout=30, what="five leases of pings")
        assert proc.poll() is None and alive([task]) == [task]
        link.close()
        proc.stdout.close()  # its writes fail now: it can act on the EOF
        proc.wait(timeout=15)
        assert not alive([task])
    finally:
        proc.kill()
        proc.wait()


def task_of(agent: int) -> int:
    children = psutil.Process(agent).children()
    return children[0].pid if children else 0


def test_the_transports_give_the_agent_its_lease(tmp_path):
    assert agent_command("python3", "c/v", "h", "~/r", 2.0, 3.5).endswith(
        "--eof-grace 2 --lease 3.5")
    target = HostTarget(name="h1", address="127.0.0.1", python=sys.executable, gpus=(),
                        ssh_user=None, ssh_port=22, identity_file=None,
                        known_hosts="~/.ssh/known_hosts", host_key_policy="strict",
                        ssh_config_file=None, connect_timeout_s=10.0)
    transport = LocalTransport(cache_root=tmp_path / "cache", lease_s=2.5)
    events: queue.Queue = queue.Queue()
    links = transport.connect([target], str(tmp_path / "run"), events)
    try:
        hello = links["h1"].hello
        assert hello is not None and hello["lease_s"] == 2.5 and hello["reaped"] == []
    finally:
        links["h1"].close()
        transport.close()
