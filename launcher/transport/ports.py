"""Ports on this machine: free ones for `ports.base: auto`, busy ones to refuse early.

Used by the launch (`cli`) and by `check`, which plans the job's ports as a
launch does.
"""

from __future__ import annotations

import errno
import random
import socket
from collections.abc import Sequence
from itertools import islice

# Where `ports.base: auto` picks, at random: below the kernel's ephemeral range,
# from which every outgoing TCP connection (gRPC between the workers, SSH)
# takes its source port. A port picked there (port 0 binds from it) could be
# taken by one in the 10-40 s before TensorFlow binds it ("Could not start
# gRPC server"); here nothing takes it unasked. Above the well-known ports and
# the simulated SSH hosts' 2222+, below the fixed bases launcher/tools/sshsim.py
# gives simulated clusters (21000+).
AUTO_PORTS = range(10000, 21000)
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's, when the file cannot be read


def ephemeral_range(path: str = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), both included."""
    try:
        with open(path) as handle:
            first, last = (int(word) for word in handle.read().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return first, last


def free_ports(count: int, among: Sequence[int] = AUTO_PORTS) -> list[int]:
    """`count` distinct ports free on this machine right now, picked at random
    `among` those outside the kernel's ephemeral range (see AUTO_PORTS)."""
    first, last = ephemeral_range()
    candidates = [p for p in among if not first <= p <= last]
    free = (p for p in random.sample(candidates, len(candidates)) if not busy_ports([p]))
    picked = list(islice(free, count))
    # An ephemeral range over all of them (or all taken): the kernel's picks, racy as they are.
    return picked + _kernel_ports(count - len(picked))


def _kernel_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def busy_ports(ports: Sequence[int]) -> list[int]:
    """The ports among `ports` that something on this machine already holds,
    over IPv4 or IPv6 (gRPC binds `[::]:port`, both at once where it can)."""
    return [port for port in ports if _held(socket.AF_INET, "", port)
            or (socket.has_ipv6 and _held(socket.AF_INET6, "::", port))]


def _held(family: socket.AddressFamily, address: str, port: int) -> bool:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no such family here (IPv6 off): nothing can hold it there
        return False
    with sock:
        # As gRPC binds: connections of an earlier run in TIME_WAIT do not
        # make a port busy; a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # the IPv6 side alone: IPv4 was asked first
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((address, port))
        except OSError as exc:
            # IPv4 refuses for any reason; IPv6 only when the port is taken
            # (a machine without an IPv6 address says "cannot assign").
            return family == socket.AF_INET or exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False
