"""This host's network interfaces and their IPv4 addresses, for the agent's hello.

The launcher puts a host's address on a named interface into TF_CONFIG when
the cluster file says `network_interface:` (launcher/spec/addresses.py); the
agent reports what the host has, so the choice is made where the interfaces
are, and a missing one can be named with the ones that exist.

Shipped to hosts with the agent: standard library only, psutil when the
agent can load it. Must not import anything of the launcher.
"""

from __future__ import annotations

from collections.abc import Callable

# Linux's ioctl for an interface's (primary) IPv4 address, from <linux/sockios.h>.
SIOCGIFADDR = 0x8915
IFNAMSIZ = 16
IFREQ_SIZE = 40  # sizeof(struct ifreq) on 64-bit Linux


def ipv4_interfaces(load_psutil: Callable[[], object] | None = None) -> dict[str, list[str]]:
    """Interface name -> its IPv4 addresses ([] for one without any), in the
    kernel's order of interfaces.

    On Linux, one ioctl per interface gives its primary address: no process, no
    psutil import (~30 ms) on every agent's start. Elsewhere, or when that
    fails, psutil's `net_if_addrs` (all addresses) when `load_psutil` finds it;
    {} when neither works.
    """
    try:
        return _from_ioctl()
    except (ImportError, OSError, AttributeError):
        pass
    psutil = load_psutil() if load_psutil is not None else None
    if psutil is None:
        return {}
    try:
        import socket

        return {name: [a.address for a in addrs if a.family == socket.AF_INET]
                for name, addrs in psutil.net_if_addrs().items()}
    except Exception:  # noqa: BLE001 - a hello without interfaces beats no hello
        return {}


def _from_ioctl() -> dict[str, list[str]]:
    # _socket, not socket: socket.py pulls in enum and more (~2 ms of every agent start).
    import _socket
    import fcntl

    out: dict[str, list[str]] = {}
    probe = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        for _index, name in _socket.if_nameindex():
            # struct ifreq: the name in IFNAMSIZ bytes, then room for the answer.
            request = name.encode()[:IFNAMSIZ - 1].ljust(IFREQ_SIZE, b"\0")
            try:
                reply = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
            except OSError:  # EADDRNOTAVAIL: up or down, but no IPv4 address
                out[name] = []
                continue
            # The answer: the name, then a struct sockaddr_in (family, port, address).
            out[name] = [_socket.inet_ntoa(reply[IFNAMSIZ + 4:IFNAMSIZ + 8])]
    finally:
        probe.close()
    return out
