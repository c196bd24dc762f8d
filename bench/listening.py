"""The agent's poll for ports its tasks open: sock_diag against /proc/net/tcp.

Every second `seal` asks which TCP sockets of the host listen
(launcher/agent/listening.py): by the kernel's sock_diag over netlink (as
`ss -lt`), or, where that fails, by reading /proc/net/tcp and tcp6 (every
bucket of the host's TCP hash, listening or not). This opens `--listen`
listening and `--connected` connected loopback sockets (a busy host's), then
times both ways alternating, `--repeat` times each: the median CPU (user +
system, the kernel's work for the process included) and wall per poll, and
the ratio. Both must find every listening socket opened here.

    python bench/listening.py [--listen 64] [--connected 0,2000] [--repeat 200]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.agent import listening  # noqa: E402


def open_sockets(listen: int, connected: int) -> list[socket.socket]:
    """`listen` listening sockets, and `connected` pairs' ends on one of them."""
    held = []
    for _ in range(listen):
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(1024)
        held.append(server)
    if connected:
        server = held[0] if held else socket.create_server(("127.0.0.1", 0), backlog=4096)
        held.append(server)
        for _ in range(connected):
            client = socket.create_connection(server.getsockname())
            peer, _ = server.accept()
            held += [client, peer]
    return held


def timed(poll, repeat: int) -> tuple[float, float, dict[int, int]]:
    """Median CPU and wall seconds of one poll over `repeat` tries."""
    cpu, wall, found = [], [], {}
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        found = poll()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall), found


def measure(listen: int, connected: int, repeat: int) -> None:
    held = open_sockets(listen, connected)
    try:
        diag_cpu, diag_wall, proc_cpu, proc_wall = [], [], [], []
        for _ in range(4):  # alternating rounds: the machine's noise falls on both
            c, w, by_diag = timed(listening._diag_listening, repeat // 4)
            diag_cpu.append(c)
            diag_wall.append(w)
            c, w, by_proc = timed(listening._proc_listening, repeat // 4)
            proc_cpu.append(c)
            proc_wall.append(w)
        # Other processes of the machine open and close ports meanwhile: compare ours.
        ours = {os.fstat(s.fileno()).st_ino for s in held[:listen]}
        assert ours <= by_diag.keys() and ours <= by_proc.keys(), "a listening socket missed"
        d, p = statistics.median(diag_cpu), statistics.median(proc_cpu)
        print(f"listen {listen:5d} connected {connected:5d}: sock_diag {d * 1e3:.3f} ms CPU "
              f"({statistics.median(diag_wall) * 1e3:.3f} ms wall), /proc/net/tcp "
              f"{p * 1e3:.3f} ms CPU ({statistics.median(proc_wall) * 1e3:.3f} ms wall): "
              f"{p / d if d else float('inf'):.1f}x; {len(ours)} of ours found by both")
    finally:
        for sock in held:
            sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, default=64)
    parser.add_argument("--connected", default="0,2000", help="comma-separated counts")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    for connected in (int(c) for c in args.connected.split(",")):
        measure(args.listen, connected, args.repeat)


if __name__ == "__main__":
    main()
