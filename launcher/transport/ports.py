"""Ports on this machine: free ones for `ports.base: auto`, busy ones to refuse early.

Used by the launch (`cli`) and by `check`, which plans the job's ports as a
launch does.
"""

from __future__ import annotations

import errno
import os
import random
import socket
import stat
import time
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

from .shipping import default_cache_root

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
# A port picked is reserved for this long against this user's other launchers
# on this machine: free until its task binds it, 10-45 s later under load
# (measured: 8 jobs on two cores). Two launchers started together otherwise
# drew the same port now and then (34 picks of 11000: ~5 % a run), and one
# job lost a generation to `port_taken`.
RESERVED_FOR_S = 600.0


def ephemeral_range(path: str = EPHEMERAL) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), both included."""
    try:
        with open(path) as handle:
            first, last = (int(word) for word in handle.read().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return first, last


def free_ports(count: int, among: Sequence[int] = AUTO_PORTS,
               reservations: Path | None = None) -> list[int]:
    """`count` distinct ports free on this machine right now, picked at random
    `among` those outside the kernel's ephemeral range (see AUTO_PORTS), none
    that another launcher of this user here reserved (`reserve`)."""
    first, last = ephemeral_range()
    candidates = [p for p in among if not first <= p <= last]
    folder = _private(reservations or reservations_folder())
    if folder is not None:
        sweep(folder)
    free = (p for p in random.sample(candidates, len(candidates))
            if not busy_ports([p]) and (folder is None or reserve(folder, p)))
    picked = list(islice(free, count))
    # An ephemeral range over all of them (or all taken): the kernel's picks, racy as they are.
    return picked + _kernel_ports(count - len(picked))


def reservations_folder() -> Path:
    """Beside the code cache: `$XDG_CACHE_HOME/mgpu-launch/ports`."""
    return default_cache_root().parent / "ports"


def _private(folder: Path) -> Path | None:
    """`folder`, made if need be, when it is a directory of this user's that
    no one else may write; else None: reservations are off, and every port
    free is taken as before them (a collision then costs a free restart,
    `port_taken`). So a read-only home, a file in the way, or a folder
    another user made on a shared /tmp never stops a launch."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = os.lstat(folder)
    except OSError:
        return None
    mine = info.st_uid == os.geteuid() and not info.st_mode & 0o022
    return folder if stat.S_ISDIR(info.st_mode) and mine else None


def _owner() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


def _read(path: Path) -> str:
    """A reservation's text: a regular file's first bytes (never a link's
    target, never a FIFO's wait). OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, 128).decode("ascii", "replace")
    finally:
        os.close(fd)


def _stale(path: Path, now: float) -> bool:
    """A reservation older than RESERVED_FOR_S (its task has bound the port,
    or never will), whose launcher, on this machine, is gone, or that is not
    a regular file at all."""
    try:
        info = os.lstat(path)
    except OSError:
        return False  # swept already
    if not stat.S_ISREG(info.st_mode) or now - info.st_mtime > RESERVED_FOR_S:
        return True
    try:
        host, pid = _read(path).split()
        # A home shared with another machine: its pids mean nothing here.
        return host == socket.gethostname() and not _alive(int(pid))
    except (OSError, ValueError):
        return False  # young and being written: held


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's
    except (OSError, OverflowError):
        return False  # no such process (or no such pid at all)
    return True


def sweep(folder: Path) -> None:
    """Remove stale reservations: the folder holds at most the ports picked in
    the last RESERVED_FOR_S by launchers still alive. (Two launchers sweeping
    the same stale file while a third reserves its port afresh could remove
    the new one: the port would have to be drawn again within that instant.)"""
    try:
        names = [entry for entry in os.scandir(folder) if entry.name.isdigit()]
    except OSError:
        return
    now = time.time()
    for entry in names:
        if _stale(Path(entry.path), now):
            _forget(Path(entry.path))


def _forget(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # another launcher swept it


def reserve(folder: Path, port: int) -> bool:
    """Reserve `port` for this launcher in `folder` (see `_private`); False
    when another live launcher of this user here holds it. Best effort: a
    reservation that cannot be written (a full disk, a quota) is no
    reservation, and the port is taken as before them."""
    path = folder / str(port)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        try:
            if _read(path).split() == _owner().split():
                os.utime(path, follow_symlinks=False)  # this launcher's own, from before
                return True
        except OSError:
            pass
        return False
    except OSError:
        return True
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(_owner() + "\n")
    except OSError:
        _forget(path)
        return True
    return True


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
