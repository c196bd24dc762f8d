"""Simulated hosts that are hosts: each in a network namespace of its own, on one switch.

The loopback simulated hosts (sshsim) share one network stack: a host's own
firewall against its peers', a cut link, another user on one host reaching a
peer never show there. Here each host is a network namespace with its own
address, loopback and nftables ruleset, joined to the others by a Linux bridge
(`ip netns`, a veth pair per host); this namespace gets an address on the
bridge too (the launcher reaches the hosts' sshds through it), and optionally
an outsider namespace on the same bridge (a machine that is not a host of the
job). The filesystem is shared, as on NFS. Root (CAP_SYS_ADMIN, CAP_NET_ADMIN)
and iproute2 are needed.

Everything made is named after one random tag, recorded (`Switch.to_json`:
`simulate --detach` writes it in its folder) and removed by `remove` (or on
leaving `switch()`): namespaces, links, the bridge, and the unreachable route
that keeps the 10.214.N.0/24 chosen from leaking elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RECORD = "netns.json"  # in a detached simulated cluster's folder
PREFIX = "10.214"  # a /24 of 10.214.0.0/16 no interface here uses


class NetsimError(RuntimeError):
    """A namespace, link or address could not be made; the text says which and why."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetsimError(f"ip {' '.join(args)}: {(done.stderr or done.stdout).strip()}")


@dataclass(frozen=True)
class Switch:
    tag: str
    bridge: str
    subnet: str  # 10.214.N (the /24)
    here: str  # this namespace's address on the switch (the launcher's)
    hosts: list[tuple[str, str]]  # (namespace, address) of each simulated host
    outsider: tuple[str, str] | None  # a namespace on the switch that is not a host

    @property
    def namespaces(self) -> list[str]:
        return [n for n, _ in self.hosts] + ([self.outsider[0]] if self.outsider else [])

    def to_json(self) -> dict:
        return {"tag": self.tag, "bridge": self.bridge, "subnet": self.subnet, "here": self.here,
                "hosts": [list(h) for h in self.hosts],
                "outsider": list(self.outsider) if self.outsider else None}

    @classmethod
    def from_json(cls, data: dict) -> Switch:
        outsider = data.get("outsider")
        return cls(str(data["tag"]), str(data["bridge"]), str(data["subnet"]),
                   str(data["here"]), [(str(n), str(a)) for n, a in data["hosts"]],
                   (str(outsider[0]), str(outsider[1])) if outsider else None)


def available() -> str:
    """"" where namespaces can be made here, else why not."""
    probe = f"mgpu-probe-{secrets.token_hex(3)}"
    try:
        done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    except OSError as exc:
        return f"no `ip` (iproute2): {exc}"
    if done.returncode != 0:
        return (done.stderr or done.stdout).strip() or "ip netns add failed"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


def _free_subnet(tag: str) -> str:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    start = int(tag[:2], 16)
    for n in range(start, start + 256):
        if f" {PREFIX}.{n % 256}." not in used:
            return f"{PREFIX}.{n % 256}"
    raise NetsimError(f"every /24 of {PREFIX}.0.0/16 is in use here")


def make(count: int, outsider: bool = True, label: str = "sim") -> Switch:
    """`count` host namespaces (and an outsider) on a new bridge; on a failure,
    what was made is removed and NetsimError raised."""
    if not 1 <= count <= 250:
        raise NetsimError(f"{count} hosts: a switch holds 1 to 250")
    tag = secrets.token_hex(3)
    subnet = _free_subnet(tag)
    names = [f"{label}-{tag}-h{i}" for i in range(count)]
    if outsider:
        names.append(f"{label}-{tag}-out")
    sw = Switch(tag, f"fwb{tag}", subnet, f"{subnet}.1",
                [(n, f"{subnet}.{i + 2}") for i, n in enumerate(names[:count])],
                (names[-1], f"{subnet}.{count + 2}") if outsider else None)
    try:
        _ip("route", "add", "unreachable", f"{subnet}.0/24", "metric", "4000")
        _ip("link", "add", sw.bridge, "type", "bridge")
        _ip("addr", "add", f"{sw.here}/24", "dev", sw.bridge)
        _ip("link", "set", sw.bridge, "up")
        for i, netns in enumerate(names):
            outer, inner = f"fwv{tag}{i}o", f"fwv{tag}{i}i"
            _ip("netns", "add", netns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
            _ip("link", "set", outer, "master", sw.bridge, "up")
            for command in (["addr", "add", f"{subnet}.{i + 2}/24", "dev", inner],
                            ["link", "set", inner, "up"], ["link", "set", "lo", "up"]):
                _ip("netns", "exec", netns, "ip", *command)
    except BaseException:
        remove(sw)
        raise
    return sw


def remove(sw: Switch) -> list[str]:
    """Remove what `make` made (what is already gone is no error); what was removed."""
    removed = []
    for i, netns in enumerate(sw.namespaces):
        subprocess.run(["ip", "link", "del", f"fwv{sw.tag}{i}o"], capture_output=True)
        if subprocess.run(["ip", "netns", "del", netns], capture_output=True).returncode == 0:
            removed.append(f"namespace {netns}")
    if subprocess.run(["ip", "link", "del", sw.bridge], capture_output=True).returncode == 0:
        removed.append(f"bridge {sw.bridge}")
    subprocess.run(["ip", "route", "del", "unreachable", f"{sw.subnet}.0/24", "metric", "4000"],
                   capture_output=True)
    return removed


@contextlib.contextmanager
def switch(count: int, outsider: bool = True, label: str = "sim") -> Iterator[Switch]:
    """`make`, and `remove` on the way out."""
    sw = make(count, outsider, label)
    try:
        yield sw
    finally:
        remove(sw)


def write_record(directory: Path, sw: Switch) -> None:
    (directory / RECORD).write_text(json.dumps(sw.to_json()))


def remove_recorded(directory: Path) -> list[str]:
    """Remove the switch recorded in `directory` (a detached `simulate --netns`)."""
    path = directory / RECORD
    try:
        sw = Switch.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return []
    removed = remove(sw)
    path.unlink(missing_ok=True)
    return removed
