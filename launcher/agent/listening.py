"""The TCP ports the host's tasks listen on, found as they open them.

The job's firewall (launcher/firewall.py) seals the TF_CONFIG ports from the
start; the ports a task opens itself (NCCL's bootstrap, the profiler, a
TensorBoard, the script's own server) are found here: every listening TCP
socket of this network namespace (the kernel's sock_diag over netlink, as
`ss -lt` asks; /proc/net/tcp and tcp6 where that fails; by socket inode)
that one of the tasks' processes holds (/proc/PID/fd links `socket:[INODE]`).
The tasks' descriptors are read only when a listening socket appears, and
at each poll of its first RECHECK_S while it seems another's (a task's child
not yet known as one of its tree may hold it); then it is another's for good:
a poll in the steady state is one sock_diag dump (0.1 ms of CPU).

Standard library only (psutil's net_connections reads /proc/net/tcp, and
every process's descriptors, each time).
"""

from __future__ import annotations

# _socket, not socket: socket.py pulls in enum and more (see launcher/nftlink.py).
import _socket
import os
import struct
from collections.abc import Callable, Iterable

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
TCP_LISTEN = 10
NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
REQUEST, DUMP = 0x1, 0x300  # NLM_F_REQUEST, NLM_F_DUMP
NLMSG_ERROR, NLMSG_DONE = 2, 3
DIAG_TIMEOUT_S = 2.0
RECHECK_S = 5.0


def listening_sockets() -> dict[int, int]:
    """socket inode -> port, for every listening TCP socket of this namespace:
    asked of the kernel's sock_diag (as `ss -lt`), /proc/net/tcp{,6} where
    that fails (reading those walks every bucket of the host's TCP hash:
    9 ms of CPU on a small VM, against well under 1 ms)."""
    try:
        return _diag_listening()
    except OSError:
        return _proc_listening()


def _diag_listening() -> dict[int, int]:
    found: dict[int, int] = {}
    sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW, NETLINK_SOCK_DIAG)
    try:
        sock.settimeout(DIAG_TIMEOUT_S)
        sock.bind((0, 0))
        for seq, family in enumerate((_socket.AF_INET, _socket.AF_INET6), 1):
            # inet_diag_req_v2: family, protocol, ext, pad, states; a zero sockid (48 bytes)
            request = struct.pack("=BBBBI", family, _socket.IPPROTO_TCP, 0, 0,
                                  1 << TCP_LISTEN) + bytes(48)
            sock.send(struct.pack("=IHHII", 16 + len(request), SOCK_DIAG_BY_FAMILY,
                                  REQUEST | DUMP, seq, 0) + request)
            while not _diag_replies(sock.recv(1 << 16), found):
                pass
    finally:
        sock.close()
    return found


def _diag_replies(data: bytes, found: dict[int, int]) -> bool:
    """Read one batch of inet_diag_msg replies into `found`; True at the dump's end."""
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR:
            error = -struct.unpack_from("=i", data, offset + 16)[0]
            raise OSError(error, os.strerror(error))
        if length >= 16 + 72:  # inet_diag_msg: sport at 4 (big-endian), inode at 68
            port = struct.unpack_from(">H", data, offset + 16 + 4)[0]
            inode = struct.unpack_from("=I", data, offset + 16 + 68)[0]
            if inode:
                found[inode] = port
        offset += max(16, (length + 3) & ~3)
    return False


def _proc_listening() -> dict[int, int]:
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
