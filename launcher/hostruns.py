"""Retention of the run folders on a host: `~/.mgpu-launch/runs/<run>-<digest>/`.

Every job leaves one folder per run on each real host (the agent's files:
pid records, TF_CONFIG, error reports, stacks; launcher/spec/plan.py
`host_run_dir`). Without cleanup they pile up. The agent of each new job
prunes them when it starts (in the background: the job does not wait):

- at most once every `PRUNE_EVERY_S` per runs folder: the first agent to
  start after that claims it (a stamp, `.pruned`, under a lock) and the others
  skip it. A folder goes only after an hour unused, so more often gains
  nothing, and hosts that share one home folder (an NFS home, simulated
  hosts) would each walk every run folder of every host: 32 hosts of a
  fan-out paid ~120 ms of CPU each for it;
- the `KEEP_RUNS` most recently used run folders stay (`MGPU_KEEP_RUNS` in the
  agent's environment overrides the number), whatever their age;
- an older one is removed only when nothing uses it: not the agent's own run,
  no agent holds its lock (`.agent.lock`, flocked by each agent for its life),
  no process recorded in its `pids/` is alive, and nothing in it changed for
  `MIN_IDLE_S` (an hour: a job between two generations, or an agent starting).

An agent that was asked no task (a launch refused after its agents started,
a spare host never used) removes its own host folder as it ends, and the run's
folder once it is empty (`remove_unused`): nothing of a job is in them.

Only folders named as the launcher names them are touched, and only under
`~/.mgpu-launch/runs`. Simulated hosts (`--local`) keep their folders inside
the run directory, which is the user's to delete.

Shipped with the agent: standard library only, run with `python -S`.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time

KEEP_RUNS = 20
MIN_IDLE_S = 3600.0
LOCK_NAME = ".agent.lock"
# <run dir name>-<8 hex digits of its path's sha256> (plan.host_run_dir).
RUN_FOLDER = re.compile(r".+-[0-9a-f]{8}")
MAX_FILES = 2000  # a folder with more files than this is looked at no further: kept
PRUNE_EVERY_S = 600.0
STAMP_NAME = ".pruned"  # in the runs folder: its mtime is the last prune's


def hold_lock(host_dir: str) -> int | None:
    """Lock the agent's host folder for this process's life (the fd stays open;
    the kernel drops the lock however the agent ends). None if it cannot."""
    try:
        fd = os.open(os.path.join(host_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # shared: a reconnecting agent too
    except OSError:
        pass
    return fd


def remove_unused(host_dir: str, lock_fd: int) -> bool:
    """The agent's end when no task was asked of it (a launch refused after its
    agents started, cli.py; a spare never used): its host folder holds nothing
    of a job and goes, with the run's folder once no other host's is in it.
    Kept when it holds any file but the lock (an earlier agent's of the run:
    a host reached again whose new agent got no task before the job ended),
    when another agent of the run holds the lock too, or when it is not a run
    folder under `~/.mgpu-launch/runs` (a simulated host's is in the run
    directory, the user's). True when removed."""
    run = os.path.dirname(os.path.abspath(host_dir))
    if runs_root(host_dir) is None or not RUN_FOLDER.fullmatch(os.path.basename(run)):
        return False
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # from shared: nobody else's
        tree = list(os.walk(host_dir, topdown=False))
        if any(files != ([LOCK_NAME] if folder == host_dir else []) for folder, _, files in tree):
            return False  # something of a job: not ours to judge
        for folder, dirs, files in tree:
            for name in files:
                os.unlink(os.path.join(folder, name))
            for name in dirs:
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    os.rmdir(path)
        os.rmdir(host_dir)
    except OSError:
        return False
    try:
        os.rmdir(run)  # the last host's folder gone: the run's too
    except OSError:
        pass
    return True


def runs_root(host_dir: str) -> str | None:
    """`~/.mgpu-launch/runs` for an agent's `<root>/<run>-<digest>/<host>` folder;
    None for any other layout (a simulated host's folder inside a run directory)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(host_dir)))
    if os.path.basename(root) == "runs" and \
            os.path.basename(os.path.dirname(root)) == ".mgpu-launch":
        return root
    return None


def prune(root: str, current: str | None = None, keep: int = KEEP_RUNS,
          min_idle_s: float = MIN_IDLE_S, now: float | None = None) -> list[str]:
    """Remove the run folders of `root` beyond the `keep` most recently used
    that nothing uses (see the module doc). Returns the names removed."""
    now = time.time() if now is None else now
    current_name = os.path.basename(os.path.abspath(current)) if current else None
    try:
        names = [n for n in os.listdir(root) if RUN_FOLDER.fullmatch(n)]
    except OSError:
        return []
    folders = []
    for name in names:
        path = os.path.join(root, name)
        if not os.path.isdir(path) or os.path.islink(path):
            continue
        used = last_used(path)
        if used is not None:
            folders.append((used, name, path))
    folders.sort(reverse=True)
    removed = []
    for used, name, path in folders[max(keep, 0):]:
        if name == current_name or now - used < min_idle_s or in_use(path):
            continue
        import shutil  # here: every agent imports this module (~2 ms of its start)

        shutil.rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


def prune_now_and_then(root: str, current: str | None = None, keep: int = KEEP_RUNS,
                       every_s: float = PRUNE_EVERY_S, now: float | None = None
                       ) -> list[str] | None:
    """`prune` unless this runs folder was pruned within `every_s` (by the
    stamp's mtime, either way: clocks of hosts sharing a home differ) or
    another agent prunes it now; None when skipped."""
    now = time.time() if now is None else now
    try:
        fd = os.open(os.path.join(root, STAMP_NAME), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return prune(root, current, keep, now=now)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another agent prunes it now
        except OSError:
            pass  # a filesystem without locks: the stamp alone decides
        stamp = os.fstat(fd)
        if stamp.st_size and abs(now - stamp.st_mtime) < every_s:
            return None
        removed = prune(root, current, keep, now=now)
        os.pwrite(fd, b"1", 0)  # sets the mtime to now: the next prune is due in every_s
        return removed
    finally:
        os.close(fd)


def last_used(path: str) -> float | None:
    """The latest change of anything in the folder; None when it is too big to
    tell (kept) or unreadable."""
    latest, seen = 0.0, 0
    for folder, _dirs, files in os.walk(path):
        for name in (folder, *(os.path.join(folder, f) for f in files)):
            seen += 1
            if seen > MAX_FILES:
                return None
            try:
                latest = max(latest, os.lstat(name).st_mtime)
            except OSError:
                continue
    return latest


def in_use(path: str) -> bool:
    """An agent holds a lock in it, or a process its pid records name is alive."""
    try:
        hosts = [os.path.join(path, h) for h in os.listdir(path)]
    except OSError:
        return True
    for host in hosts:
        if not os.path.isdir(host):
            continue
        if _locked(os.path.join(host, LOCK_NAME)) or _live_pid(os.path.join(host, "pids")):
            return True
    return False


def _locked(lock_path: str) -> bool:
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no agent of ours holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)  # also drops the lock we may have taken


def _live_pid(folder: str) -> bool:
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        return False
    for name in names:
        try:
            with open(os.path.join(folder, name)) as handle:
                pid = int(json.load(handle)["pid"])
            os.kill(pid, 0)
            return True
        except PermissionError:
            return True  # alive, someone else's
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return False
