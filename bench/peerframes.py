"""CPU per chunk of the peer copy, in each process, over real pipes.

The second copy of a save (launcher/agent/peercopy.py) goes agent A ->
launcher -> agent B over the agents' channels. This wires the real parts in
one process, as the launcher and two agents wire them, each agent's
stdin/stdout an OS pipe: host0's PeerCopies sends a slot of `--mb` MB
(512 KiB chunks) through its Emitter; the launcher's AgentLink reads it, the
supervisor's part (check_message, PeerRelay) forwards it on this thread,
host1's link writes it; host1's command reader and command thread take it and
its receiver thread hashes and writes it into host1's memory folder. Then it
prints each thread's CPU per chunk, grouped by process, and which of it runs
at SCHED_IDLE (the agents' copy threads), best of `--repeat`:

    .venv/bin/python bench/peerframes.py [--mb 100] [--repeat 3]

Each figure is that thread's CPU clock (pthread_getcpuclockid): what the
training beside it would lose on a busy core. The pipes' far ends (a thread
that reads what nobody else does: host0's acks are read by its reader) are
counted where they run in the real processes.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.agent import memcopy  # noqa: E402
from launcher.agent.commands import Commands, Lines, read_commands  # noqa: E402
from launcher.agent.peercopy import CHUNK, PeerCopies, _Work  # noqa: E402
from launcher.agent.protocol import Emitter  # noqa: E402
from launcher.job.record import events as ev  # noqa: E402
from launcher.job.run.peerrelay import PeerRelay  # noqa: E402
from launcher.job.run.protocol import check_message  # noqa: E402
from launcher.transport.link import AgentLink, AgentMessage  # noqa: E402
from tests.test_memcopy import make_slot  # noqa: E402

HOSTS = ("host0", "host1")


class Agent:
    """One host's agent parts that the copy uses, on pipes of its own."""

    def __init__(self, host: str, root: Path) -> None:
        cmd_r, self.cmd_w = os.pipe()  # launcher -> agent (its stdin)
        self.ev_r, ev_w = os.pipe()  # agent -> launcher (its stdout)
        self.stdin = os.fdopen(cmd_r, "rb")
        self.stdout = os.fdopen(ev_w, "wb")
        emit = Emitter(self.stdout)
        self.memory = memcopy.MemoryCopies(str(root / "run" / host), host,
                                           lambda text: None, shm=str(root / "shm"))
        self.peers = PeerCopies(self.memory, host, emit)
        self.memory.peers = self.peers
        commands = Commands(None, None, emit)
        commands.peers = self.peers
        threading.Thread(target=read_commands, daemon=True,
                         args=(commands, Lines(), self.stdin, lambda: None)).start()


def cpu(thread: threading.Thread) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def owner(thread: threading.Thread, agents: dict[str, Agent],
          links: dict[str, AgentLink]) -> str | None:
    """Which process a thread stands for, and its part; None: not the copy's."""
    if thread is threading.main_thread():
        return "launcher: supervisor (parse check, relay)"
    for host, link in links.items():
        if thread is link._reader:
            return f"launcher: {host}'s link reader"
        if thread is link._writer:
            return f"launcher: {host}'s link writer"
    for host, agent in agents.items():
        if thread is agent.peers._thread:
            return f"{host} agent: sender (SCHED_IDLE)"
        if thread is agent.peers._receiver:
            return f"{host} agent: receiver (SCHED_IDLE)"
        args = getattr(thread, "_args", ())
        if len(args) == 3 and args[0] is agent.stdin:
            return f"{host} agent: stdin reader"
        if len(args) == 4 and args[2] is agent.stdin:
            return f"{host} agent: command thread"
    return None


def one_run(mb: int, tmp: Path, seq: int) -> tuple[dict[str, float], int]:
    """CPU seconds per thread for one copy of an `mb` MB save; its chunks."""
    agents = {h: Agent(h, tmp / f"r{seq}") for h in HOSTS}
    events: queue.Queue[AgentMessage] = queue.Queue()
    links = {h: AgentLink(h, os.fdopen(a.cmd_w, "wb"), os.fdopen(a.ev_r, "rb"), events,
                          ping_every_s=None) for h, a in agents.items()}
    for link in links.values():
        link.start_reading()
    told: list[ev.Event] = []
    relay = PeerRelay(lambda: links, told.append, hold_s=0)  # sent at once, as a placement
    relay.use_plan(HOSTS, 2)
    env = {"MGPU_MEMORY_COPIES": "2"}
    agents["host0"].memory.task_env("worker0", env)
    slot = make_slot(Path(env["MGPU_MEMORY_DIR"]), 1, "ckpt-1", mb * 10**6, ["ckpt-1"])
    chunks = -(-mb * 10**6 // CHUNK) + 2
    before = {t: cpu(t) for t in threading.enumerate()}
    agents["host0"].peers._enqueue(_Work(str(slot), "host0-1", routine=False))
    deadline = time.monotonic() + 600
    while not any(isinstance(e, ev.MemoryCopy) for e in told):
        if time.monotonic() > deadline:
            raise SystemExit("the copy did not end in 600 s")
        try:
            raw = events.get(timeout=1)
        except queue.Empty:
            continue
        relay.consumed(AgentMessage(raw.host, check_message(raw.message), raw.link_id))
    [copy] = [e for e in told if isinstance(e, ev.MemoryCopy)]
    if copy.error:
        raise SystemExit(f"the copy failed: {copy.error}")
    figures: dict[str, float] = {}
    for thread in threading.enumerate():
        name = owner(thread, agents, links)
        if name is not None:
            figures[name] = figures.get(name, 0.0) + cpu(thread) - before.get(thread, 0.0)
    for link in links.values():
        link.close()
    return figures, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seq in range(args.repeat):
            figures, chunks = one_run(args.mb, Path(tmp), seq)
            for name, seconds in figures.items():
                best[name] = min(best.get(name, float("inf")), seconds)
    print(f"{args.mb} MB, {chunks} chunks of {CHUNK // 1024} KiB; CPU per chunk, best of "
          f"{args.repeat} (load {os.getloadavg()[0]:.1f})")
    for process in ("host0 agent", "launcher", "host1 agent"):
        parts = {n: s for n, s in best.items() if n.startswith(process)}
        normal = sum(s for n, s in parts.items() if "SCHED_IDLE" not in n)
        for name, seconds in sorted(parts.items()):
            print(f"  {name:48s} {seconds / chunks * 1000:7.3f} ms")
        print(f"  {process + ': at normal priority':48s} {normal / chunks * 1000:7.3f} ms"
              f"   ({normal:.3f} s a save)")


if __name__ == "__main__":
    main()
