"""The firewall tables the user's agents installed on this machine, and whose agent is gone.

A killed agent's rules are removed by the next agent of its run directory;
when none comes (the launcher gave up on the host, or died with it), any later
agent of the user on the same machine and network namespace removes them
(`firewall.sweep`): each installation is also registered here with its
agent's pid and start time, and `gone` lists those whose agent is gone.

One folder per machine and network namespace, under ~/.mgpu-launch/firewall/:
where the hosts share a home folder (NFS), an agent reads its own machine's
entries at its start, not every host's (a launch on N such hosts read N x N
files), and the `nft` removals' lock is per machine too, so hosts do not wait
for each other's. Entries directly in ~/.mgpu-launch/firewall/ are an older
version's: still listed, and removed like the others.

Shipped with the agent (firewall imports it): standard library only.
"""

from __future__ import annotations

import json
import os
import re

# An entry's (path, agent pid, record) (the record: what firewall.remove takes)
Entry = tuple[str, int, dict]


def root() -> str:
    return os.path.join(os.path.expanduser("~"), ".mgpu-launch", "firewall")


def folder() -> str:
    """This machine's and network namespace's folder (simulated hosts share both)."""
    here = _here()
    namespace = "".join(c for c in here["netns"] if c.isdigit()) or "0"
    machine = re.sub(r"[^A-Za-z0-9._-]", "_", here["node"])[:200] or "_"
    return os.path.join(root(), f"{machine}.{namespace}")


def lock_file() -> int | None:
    """An fd of this machine's and namespace's lock file for `nft` removals, or None."""
    here = folder()
    try:
        os.makedirs(here, mode=0o700, exist_ok=True)
        return os.open(os.path.join(here, "nft.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None


def register(table: str, run_dir: str, record: dict) -> None:
    """Record an installation of this agent (best effort)."""
    entry = {**_here(), "pid": os.getpid(), "start": _start_time(os.getpid()),
             "run_dir": run_dir, "record": record}
    here = folder()
    try:
        os.makedirs(here, mode=0o700, exist_ok=True)
        path = os.path.join(here, f"{table}.json")
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(entry, handle)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # the run directory's record still serves the next agent of the run


def unregister(table: object) -> None:
    for base in (folder(), root()):
        try:
            os.unlink(os.path.join(base, f"{table}.json"))
        except OSError:
            pass


def gone() -> list[Entry]:
    """The entries of this machine and namespace whose agent is no longer running."""
    paths = []
    for base in (folder(), root()):  # root: an older version's entries
        try:
            paths += [os.path.join(base, n) for n in os.listdir(base) if n.endswith(".json")]
        except OSError:
            pass
    here, found = _here(), []
    for path in paths:
        try:
            with open(path, "rb") as handle:
                entry = json.loads(handle.read(1 << 20))
            pid, record = entry["pid"], entry["record"]
            mine = all(entry.get(k) == v for k, v in here.items())
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if not mine or not isinstance(pid, int) or not isinstance(record, dict):
            continue  # another machine's or namespace's
        started = _start_time(pid)
        if started is not None and started == entry.get("start"):
            continue  # its agent still runs
        found.append((path, pid, record))
    return found


def _start_time(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _here() -> dict[str, str]:
    """This machine and network namespace (simulated hosts share a home folder)."""
    try:
        netns = os.readlink("/proc/self/ns/net")
    except OSError:
        netns = ""
    return {"node": os.uname().nodename, "netns": netns}
