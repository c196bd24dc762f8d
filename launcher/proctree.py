"""A task's whole process tree, tracked from its start, so that nothing it
started outlives it: not a data-loader child in its process group, and not a
child that left the group and the session (`setsid`, a daemon) and ignores
SIGTERM. Once the task's main process is gone its orphans are children of
init: a search for its children then finds nothing, so the tree is kept
while it lives, and reaped by what was kept.

Two ways, the best the host allows (`TaskTree.mode`):
- `cgroup`: cgroup v2 is mounted and the agent may create cgroups under its
  own. Each task starts in a cgroup of its own (written in the child before
  `exec`, so no process of it is ever outside); its members are
  `cgroup.procs`, whatever they did with sessions or parents. Nothing polls.
- `tracked`: otherwise one thread of the agent (`Tracker`) reads /proc every
  TRACK_EVERY_S and adds to each tree the processes whose parent is in it,
  each with its start time (a pid reused later is never touched); at the
  reap, every process whose environment holds the task's token is added too
  (a child born and orphaned between two reads keeps the token).

Shipped with the agent (`python -S`): standard library only, Linux /proc.
Must not import anything of the launcher.
"""

from __future__ import annotations

import os
import signal
import threading
import time

TRACK_EVERY_S = 0.5  # /proc read for every tree of the host; a few ms each time
REAP_WAIT_S = 2.0  # after SIGKILL, how long to wait for the tree to be gone
CGROUP_PREFIX = "mgpu-"


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, parent pid, process group, start time in clock ticks since boot)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
        fields = data[data.rindex(b")") + 2:].split()
        return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def processes() -> dict[int, tuple[str, int, int, int]]:
    """Every live (non-zombie) process: pid -> `proc_stat`."""
    table = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for entry in entries:
        if entry.isdigit():
            stat = proc_stat(int(entry))
            if stat is not None and stat[0] not in "ZX":
                table[int(entry)] = stat
    return table


def _table() -> dict[int, tuple[int, int]]:
    """Every live (non-zombie) process: pid -> (parent pid, start)."""
    return {pid: (stat[1], stat[3]) for pid, stat in processes().items()}


def has_env(pid: int, needle: bytes) -> bool:
    """Whether the process's environment holds `needle` (`NAME=value`)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return needle in handle.read().split(b"\0")
    except OSError:
        return False


def cgroup_home() -> str | None:
    """The agent's own cgroup v2 folder when it may create cgroups in it, else None."""
    try:
        with open("/proc/self/cgroup") as handle:
            paths = [line.strip()[3:] for line in handle if line.startswith("0::")]
        with open("/proc/self/mounts") as handle:
            mounts = [line.split()[1] for line in handle if line.split()[2:3] == ["cgroup2"]]
    except (OSError, IndexError):
        return None
    if not paths or not mounts:
        return None
    home = os.path.join(mounts[0], paths[0].lstrip("/"))
    probe = os.path.join(home, f"{CGROUP_PREFIX}probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError:
        return None
    return home


class TaskTree:
    """Every process a task (or a standby) started: `members()`, `signal()`, `reap()`."""

    def __init__(self, token_needle: bytes, home: str | None) -> None:
        self._needle = token_needle  # b"MGPU_TASK_TOKEN=..." in its environment
        self._lock = threading.Lock()
        self._members: dict[int, int] = {}  # pid -> start time (tracked mode)
        self._root: int | None = None
        self.cgroup: str | None = None
        self._procs_fd: int | None = None
        if home is not None:
            folder = os.path.join(home, CGROUP_PREFIX + os.urandom(6).hex())
            try:
                os.mkdir(folder)
                self._procs_fd = os.open(os.path.join(folder, "cgroup.procs"),
                                         os.O_WRONLY | os.O_CLOEXEC)
                self.cgroup = folder
            except OSError:
                _rmdir(folder)

    @property
    def mode(self) -> str:
        return "cgroup" if self.cgroup else "tracked"

    def preexec(self, inner):
        """`inner`, then (in the child, before exec) join the task's cgroup."""
        fd = self._procs_fd

        def preexec() -> None:
            inner()
            if fd is not None:
                try:
                    os.write(fd, b"0")
                except OSError:
                    pass  # started() sees it and tracks the tree instead
        return preexec

    def started(self, pid: int) -> None:
        """The tree's first process runs (call right after the spawn, in the parent)."""
        if self._procs_fd is not None:
            os.close(self._procs_fd)
            self._procs_fd = None
            if pid not in self._cgroup_pids():  # the child could not join it
                _rmdir(self.cgroup)
                self.cgroup = None
        stat = proc_stat(pid)
        with self._lock:
            self._root = pid
            if stat is not None:
                self._members[pid] = stat[3]

    def spawn_failed(self) -> None:
        if self._procs_fd is not None:
            os.close(self._procs_fd)
            self._procs_fd = None
        self.close()

    def grow(self, table: dict[int, tuple[int, int]]) -> None:
        """Add the children of members (tracked mode); forget the dead."""
        with self._lock:
            members = {pid: start for pid, start in self._members.items()
                       if table.get(pid, (0, -1))[1] == start}
            added = True
            while added:
                added = False
                for pid, (parent, start) in table.items():
                    if pid not in members and parent in members:
                        members[pid] = start
                        added = True
            self._members = members

    def known(self) -> set[int]:
        """The tree's processes as last seen, cheaply (for a poll): cgroup, its
        members now; tracked, at the tracker's last read (every TRACK_EVERY_S),
        without `members`' read of every process's environment."""
        if self.cgroup:
            return set(self._cgroup_pids())
        with self._lock:
            return set(self._members)

    def members(self) -> set[int]:
        """The live processes of the tree now (the main process too, if alive)."""
        if self.cgroup:
            return {pid for pid in self._cgroup_pids()
                    if (proc_stat(pid) or ("Z",))[0] not in "ZX"}
        table = _table()
        self.grow(table)
        with self._lock:
            pids = set(self._members)
        pids |= {pid for pid in table if pid != os.getpid() and has_env(pid, self._needle)}
        return pids

    def signal(self, signum: int, but_group: int | None = None) -> None:
        """Signal every member, but those of process group `but_group` (signalled already)."""
        for pid in self.members():
            try:
                if but_group is None or os.getpgid(pid) != but_group:
                    os.kill(pid, signum)
            except OSError:
                pass

    def reap(self, wait_s: float = REAP_WAIT_S) -> set[int]:
        """SIGKILL whatever is left of the tree and wait (bounded) until it is
        gone; then drop its cgroup. Returns the pids killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.members()
            if not pids:
                break
            killed |= pids
            if self.cgroup and os.path.exists(os.path.join(self.cgroup, "cgroup.kill")):
                _write(os.path.join(self.cgroup, "cgroup.kill"), "1")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.close()
        return killed

    def close(self) -> None:
        """Drop the cgroup (only an empty one can go; a later close retries)."""
        if self.cgroup and not self.members():
            for _ in range(50):  # a killed member leaves its cgroup a moment after
                if _rmdir(self.cgroup):
                    break
                time.sleep(0.01)

    def _cgroup_pids(self) -> set[int]:
        try:
            with open(os.path.join(self.cgroup or "", "cgroup.procs")) as handle:
                return {int(line) for line in handle if line.strip()}
        except (OSError, ValueError):
            return set()


class Tracker:
    """One thread that grows every tracked-mode tree of the agent from /proc."""

    def __init__(self, every_s: float = TRACK_EVERY_S) -> None:
        self._every_s = every_s
        self._trees: list[TaskTree] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, tree: TaskTree) -> None:
        if tree.mode != "tracked":
            return
        with self._lock:
            self._trees.append(tree)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()

    def remove(self, tree: TaskTree) -> None:
        with self._lock:
            if tree in self._trees:
                self._trees.remove(tree)

    def _run(self) -> None:
        while True:
            time.sleep(self._every_s)
            with self._lock:
                trees = list(self._trees)
            if trees:
                table = _table()
                for tree in trees:
                    tree.grow(table)


def _rmdir(path: str | None) -> bool:
    try:
        os.rmdir(path or "")
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(text)
    except OSError:
        pass
