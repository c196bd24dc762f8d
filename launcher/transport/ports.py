"""Ports on this machine: free ones for `ports.base: auto`, busy ones to refuse early.

Used by the launch (`cli`) and by `check`, which plans the job's ports as a
launch does.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that are free on this machine right now."""
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
    """The ports among `ports` that something on this machine already holds."""
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As gRPC binds: connections of an earlier run in TIME_WAIT do not
            # make a port busy; a listener does.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("", port))
            except OSError:
                busy.append(port)
    return busy
