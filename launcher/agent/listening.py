"""The TCP ports the host's tasks listen on, found as they open them.

The job's firewall (launcher/firewall.py) seals the TF_CONFIG ports from the
start; the ports a task opens itself (NCCL's bootstrap, the profiler, a
TensorBoard, the script's own server) are found here: every listening TCP
socket of this network namespace (/proc/net/tcp and tcp6, state LISTEN, by
socket inode) that one of the tasks' processes holds (/proc/PID/fd links
`socket:[INODE]`). The tasks' descriptors are read only when a listening
socket appears, and at each poll of its first RECHECK_S while it seems
another's (a task's child not yet known as one of its tree may hold it); then
it is another's for good: a poll in the steady state reads the two /proc/net
files only.

Standard library only (psutil's net_connections reads the same files, and
every process's descriptors each time).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
RECHECK_S = 5.0


def listening_sockets() -> dict[int, int]:
    """socket inode -> port, for every listening TCP socket of this namespace."""
    found = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as handle:
                next(handle, None)  # the header
                for line in handle:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == LISTEN and fields[9] != "0":
                        found[int(fields[9])] = int(fields[1].rsplit(":", 1)[1], 16)
        except (OSError, ValueError, IndexError):
            continue  # no IPv6 here, or a row cut short: the rest still counts
    return found


def socket_inodes(pid: int) -> set[int]:
    """The socket inodes process `pid` holds (none once it is gone)."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return set()
    found = set()
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found.add(int(link[8:-1]))
    return found


class Listening:
    """The ports the tasks listen on, polled: `ports(pids)`."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.mine: dict[int, int] = {}  # inode -> port: the tasks' listening sockets
        self.others: dict[int, float] = {}  # inode -> when judged another process's

    def ports(self, pids: Callable[[], Iterable[int]]) -> set[int]:
        """The ports of the listening sockets the processes `pids()` hold now
        (asked only when a listening socket is to judge: a tree's members may
        cost a read of every process of the host)."""
        rows = listening_sockets()
        now = self.clock()
        self.mine = {i: p for i, p in self.mine.items() if i in rows}
        self.others = {i: t for i, t in self.others.items() if i in rows}
        unjudged = [i for i in rows if i not in self.mine
                    and now - self.others.get(i, now) < RECHECK_S]
        if unjudged:
            held: set[int] = set()
            for pid in pids():
                held |= socket_inodes(pid)
            for inode in unjudged:
                if inode in held:
                    self.mine[inode] = rows[inode]
                    self.others.pop(inode, None)
                else:
                    self.others.setdefault(inode, now)
        return set(self.mine.values())
