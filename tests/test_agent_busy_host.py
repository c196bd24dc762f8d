"""A real agent on a host whose core the training keeps busy, sending a
memory-tier copy to another host's memory (launcher/agent/peercopy.py) at a
low priority: the copy takes what the training leaves, and nothing else of the
agent waits for it. Its heartbeats, which the launcher judges the host by (an
agent silent for `restart.heartbeat_timeout_s`, 10 s, is a lost host and the
job restarts), keep their second; the copy goes on meanwhile and arrives whole.

What it guards (protocol.Emitter's handoff, memcopy.low_priority): a copy's
thread that wrote its 512 KiB frames under the lock every event takes held the
heartbeats for the whole copy once niced (25 s here: it took the lock back
before a woken heartbeat thread ran), and 4-10 s at SCHED_IDLE (taken off the
CPU while holding that lock or the GIL, it waited seconds for its next turn)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from launcher.agent import memcopy
from tests.agentproc import AgentProc
from tests.conftest import wait_for
from tests.test_memcopy import make_slot

HEARTBEATS = 10  # watched while the copy runs beside the busy core: ~10 s
MAX_GAP_S = 2.5  # one every second; the busy core's scheduling delays on top
SIZE = 160 << 20  # 320 chunks: still under way after the heartbeats watched


def one_core() -> list[str]:
    """A prefix that runs a command on one core of this machine's."""
    return ["taskset", "-c", str(min(os.sched_getaffinity(0)))]


def busy_core() -> list[subprocess.Popen]:
    """The host's training: processes keeping that core busy at normal priority,
    in the agent's session. (A task has a session of its own, the agent's
    setsid; where the kernel groups the scheduling by session, autogroup as on
    this machine, the agent's threads would compete with each task as an equal.
    These share the agent's, as every process of an SSH login does where
    systemd's cgroups group the scheduling instead.)"""
    return [subprocess.Popen([*one_core(), sys.executable, "-c", "while True: pass"])
            for _ in range(4)]


def test_a_copy_beside_busy_training_does_not_hold_back_the_agents_heartbeats(tmp_path: Path):
    agent: AgentProc | None = None

    def acknowledge(message: dict) -> None:  # the launcher's relay and the receiver, at once
        if message.get("ev") == "peer_begin":  # the relay's go
            assert agent is not None
            agent.send({"op": "peer_ack", "xfer": message["xfer"], "n": -1})
        if message.get("ev") == "peer_chunk":
            assert agent is not None
            agent.send({"op": "peer_ack", "xfer": message["xfer"], "n": message["n"]})

    agent = AgentProc(tmp_path / "run", on_message=acknowledge, new_session=False,
                      prefix=one_core())
    hogs: list[subprocess.Popen] = []
    try:
        agent.hello()
        # A completed save of this host's chief, as the training process leaves it.
        root = Path(memcopy.job_folder(str(agent.run_dir), "h1"))
        root.mkdir(mode=0o700)
        (root / memcopy.OWNER).write_text(str(agent.proc.pid))
        slot = make_slot(root / "worker0", 1, "ckpt-1", SIZE, ["ckpt-1"])
        hogs = busy_core()
        agent.send({"op": "peer_send", "xfer": "x1", "slot": str(slot)})
        first = agent.wait_event("peer_begin", timeout=30, xfer="x1")["_at"]

        def beats() -> list[float]:
            return [m["_at"] for m in agent.events("heartbeat") if m["_at"] > first]
        wait_for(lambda: len(beats()) >= HEARTBEATS, timeout=HEARTBEATS * MAX_GAP_S,
                 what=f"{HEARTBEATS} heartbeats while the copy runs beside the training; got "
                      f"{len(beats())}")
        times = [first, *beats()[:HEARTBEATS]]
        gaps = [round(b - a, 2) for a, b in zip(times, times[1:], strict=False)]
        assert max(gaps) < MAX_GAP_S, gaps
        # The copy ran all along (on what the training left), not yet done.
        chunks = agent.events("peer_chunk", xfer="x1")
        assert chunks and not agent.events("peer_end") and len(chunks) < SIZE >> 19, \
            len(chunks)
        # The training ends: the copy goes on, every byte in order and as hashed.
        for hog in hogs:
            hog.kill()
        end = agent.wait_event("peer_end", timeout=60, xfer="x1")
        chunks = agent.events("peer_chunk", xfer="x1")
        assert [c["n"] for c in chunks] == list(range(len(chunks)))
        for name, digest in end["sha256"].items():
            sent = b"".join(c["raw"] for c in chunks if c["file"] == name)
            assert sent == (slot / name).read_bytes()
            assert hashlib.sha256(sent).hexdigest() == digest
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        agent.close()
