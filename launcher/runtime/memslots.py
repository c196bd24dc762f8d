"""The memory tier's folders in the training process: working folders and slots.

`checkpoint: {memory: true}` gives each task a private folder in host memory
(`MGPU_MEMORY_DIR`, under /dev/shm, 0700, made by the agent:
launcher/agent/memcopy.py). In it:

- `w-<key>[-<saver>]/`: a saver's working folder, one per directory the script
  saves to and kind of saver (a manager's, Keras' `backup`, `model`)
  (`key`: a hash of that directory; a non-chief worker's scratch folder,
  `workertemp_<n>`, is keyed as the chief's folder its restore reads, so the
  worker's saves and the chief's share a key: memtier.py's `_stands_for`);
- `s-<seq>/`: a slot, one completed save: its files (hard links of the working
  folder's, or the files themselves, moved) and `manifest.json`, written last
  (a slot without it is a save that did not complete). At most `copies` slots
  are kept; the agent copies the newest of each directory to that directory.

Beside the tasks' folders, the agent keeps `peer-<host>/s-<seq>/`: saves of
another host (or placed back here for a restore) with their sha256 sums,
verified before a restore reads one (launcher/agent/peercopy.py).

Standard library only; must not import the launcher side.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import time
from typing import Any

MANIFEST = "manifest.json"
COPYING = ".mgpu-copying"  # in a directory while an agent copies a save to it (agent/memcopy.py)
STALE_S = 5.0  # a marker not refreshed for this long: its agent died
WAIT_S = 600.0
POINTERS = ("checkpoint", "training_metadata.json")  # copied last: they name the rest
PUBLISH = ".mgpu-publish"  # an agent's copy committed, its renames to do (agent/publish.py)
ORDER = ".mgpu-order"  # the saves' order, published with them (agent/saveorder.py)
_TEMP_PART = re.compile(r"^workertemp_\d+$")
INCOMING_WAIT_S = 120.0  # at most, at a restore, for a copy being placed in this memory


def shared_of(target: str) -> str:
    """The directory a worker's scratch folder stands for: tf_keras' (and TF's
    tutorials') `workertemp_<n>` component left out."""
    parts = [p for p in os.path.abspath(target).split(os.sep) if not _TEMP_PART.match(p)]
    return os.sep.join(parts)


def key_of(target: str) -> str:
    """A directory's key: a worker's scratch folder maps to the chief's."""
    return hashlib.sha1(shared_of(target).encode()).hexdigest()[:16]


def working(root: str, target: str, saver: str = "") -> str:
    """The working folder of one saver of `target` (a manager: ""; Keras'
    `backup`, `model`): two savers of one directory never touch each other's."""
    path = os.path.join(root, "w-" + key_of(target) + (f"-{saver}" if saver else ""))
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def slots(root: str) -> list[tuple[int, str]]:
    """(seq, path) of the complete slots under `root`, oldest first."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else ():
        if name.startswith("s-") and name[2:].isdigit():
            path = os.path.join(root, name)
            if os.path.exists(os.path.join(path, MANIFEST)):
                found.append((int(name[2:]), path))
    return sorted(found)


def next_seq(root: str) -> int:
    numbers = [int(n[2:]) for n in os.listdir(root) if n.startswith("s-") and n[2:].isdigit()]
    return max(numbers, default=0) + 1


def manifest(slot: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(slot, MANIFEST), encoding="utf-8") as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def ordered(names: list[str]) -> list[str]:
    """The copy order: data first, the files that name a checkpoint last."""
    return sorted(names, key=lambda n: (n in POINTERS, n))


def seal(slot: str, record: dict[str, Any]) -> None:
    """Write the slot's manifest (aside, then renamed): the save is complete."""
    for name in os.listdir(slot):
        path = os.path.join(slot, name)
        if os.path.isfile(path):
            os.chmod(path, 0o600)
    aside = os.path.join(slot, ".manifest.part")
    with open(aside, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(aside, os.path.join(slot, MANIFEST))


def prune(root: str, keep: int) -> None:
    """Keep the newest `keep` complete slots; drop older ones and dead partial ones."""
    complete = slots(root)
    for _seq, path in complete[:-keep] if keep > 0 else complete:
        shutil.rmtree(path, ignore_errors=True)


def matching(roots: list[str], key: str, kind: str, pointer: str,
             sizes: dict[str, int]) -> str | None:
    """The newest slot under `roots` (this task's first) holding the very save the
    shared directory names: same key and kind, the same `pointer` (the
    checkpoint's name, or the backup's metadata) and the same file sizes."""
    for root in roots:
        for _seq, slot in reversed(slots(root)):
            record = manifest(slot)
            if not record or record.get("key") != key or record.get("kind") != kind:
                continue
            if record.get("pointer") != pointer:
                continue
            if all(_size(os.path.join(slot, n)) == size for n, size in sizes.items()) \
                    and verified(slot, record):
                return slot
    return None


def verified(slot: str, record: dict[str, Any]) -> bool:
    """A copy that came from another host (launcher/agent/peercopy.py) reads as
    its source hashed it (sha256 of each file); a slot made here has no sums."""
    for name, expected in (record.get("sha256") or {}).items():
        digest = hashlib.sha256()
        try:
            with open(os.path.join(slot, os.path.basename(name)), "rb") as handle:
                while chunk := handle.read(2**20):
                    digest.update(chunk)
        except OSError:
            return False
        if digest.hexdigest() != expected:
            return False
    return True


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def sibling_roots(root: str) -> list[str]:
    """This task's folder, then the other tasks' of this job on this host."""
    parent = os.path.dirname(root)
    others = sorted(os.path.join(parent, n) for n in os.listdir(parent)
                    if os.path.join(parent, n) != root) if os.path.isdir(parent) else []
    return [root, *[o for o in others if os.path.isdir(o)]]


def incoming(root: str) -> bool:
    """A copy is being placed in this job's memory folder on this host
    (`.in-<xfer>/`: the agent receives one, launcher/agent/peercopy.py)."""
    try:
        return any(n.startswith(".in-") for n in os.listdir(os.path.dirname(root)))
    except OSError:
        return False


def settled_roots(root: str, timeout_s: float = INCOMING_WAIT_S) -> list[str]:
    """`sibling_roots`, once the copies placed here for this restore are in
    (at most `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and incoming(root):
        time.sleep(0.05)
    return sibling_roots(root)


def free_bytes(root: str) -> int:
    try:
        stats = os.statvfs(root)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def estimate(model: object) -> int:
    """The bytes of a model's variables and its optimizer's (0: not known):
    about what a save of it writes."""
    total = 0
    try:
        optimizer = getattr(model, "optimizer", None)
        for variable in [*getattr(model, "weights", ()), *getattr(optimizer, "variables", ())]:
            count = 1
            for dim in tuple(variable.shape):
                count *= int(dim or 0)
            dtype = getattr(variable, "dtype", "float32")
            total += count * int(getattr(dtype, "size", 0) or itemsize(str(dtype)))
    except Exception:  # noqa: BLE001 - a layout we do not know: no estimate
        return 0
    return total


def itemsize(dtype: str) -> int:
    digits = "".join(c for c in dtype.rsplit(".", 1)[-1] if c.isdigit())
    return max(1, int(digits) // 8) if digits else 4


def no_space(exc: BaseException) -> bool:
    """A write that found no room (ENOSPC, however the library words it)."""
    seen: BaseException | None = exc
    for _ in range(8):  # the exception's chain: causes and contexts
        if seen is None:
            return False
        if getattr(seen, "errno", None) == errno.ENOSPC or "No space left" in str(seen) \
                or "errno = 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def size_of(path: str) -> int:
    total = 0
    for folder, _dirs, files in os.walk(path):
        total += sum(_size(os.path.join(folder, f)) for f in files)
    return total


def mirror(work: str, folder: str) -> None:
    """A worker's scratch folder (`workertemp_<n>`, never copied) shows what its
    manager wrote: after each save, a link to each file of the working folder
    in memory (the links to files the manager has since deleted go). The script
    lists, reads, copies and removes them where it saved them, as without the
    tier (TF's custom-loop tutorial `rmtree`s the folder after each save); the
    bytes stay in memory: the save's stall stays memory's. A filesystem without
    symbolic links: the folder alone."""
    os.makedirs(folder, exist_ok=True)
    names = [n for n in os.listdir(work)
             if not n.startswith(".") and os.path.isfile(os.path.join(work, n))]
    if not _mirrored:
        atexit.register(unmirror)
    _mirrored.add((work, folder))
    try:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.path.islink(path) and (not os.path.exists(path) or name not in names
                                         and os.path.dirname(os.readlink(path)) == work):
                os.unlink(path)  # a checkpoint the manager deleted, or an earlier run's
        for name in names:
            path, source = os.path.join(folder, name), os.path.join(work, name)
            if not (os.path.islink(path) and os.readlink(path) == source):
                aside = os.path.join(folder, f".{name}.mgpu-link")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(aside)
                os.symlink(source, aside)
                os.replace(aside, path)
    except OSError:
        pass  # no links there (or the script removed the folder meanwhile)


_mirrored: set[tuple[str, str]] = set()  # (working folder, scratch folder) linked


def unmirror() -> None:
    """At the program's end, the links `mirror` left (a script that did not
    remove its scratch folder) go: they would dangle once the job's memory
    folder goes (a copy of the directory would fail on them, or keep links
    to nothing). A crash leaves them: the next `mirror` there removes them."""
    for work, folder in list(_mirrored):
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    if os.path.islink(path) and os.path.dirname(os.readlink(path)) == work:
                        os.unlink(path)


def finish_publish(target: str) -> None:
    """An agent's copy into `target` that died after its commit (its journal,
    launcher/agent/publish.py): its staged files renamed into place, so that
    a restore reads one save's files, never new weights with old metadata.
    Called once no agent marks a copy under way there (`wait_for_copy`)."""
    try:
        with open(os.path.join(target, PUBLISH), encoding="utf-8") as handle:
            names = json.load(handle)
    except (OSError, ValueError):
        return
    for name in names if isinstance(names, list) else ():
        if not isinstance(name, str) or os.sep in name or (
                name.startswith(".") and name != ORDER):
            continue
        part, final = os.path.join(target, f".{name}.mgpu-part"), os.path.join(target, name)
        try:
            if os.path.isdir(part) and os.path.isdir(final):
                os.replace(final, final + ".mgpu-part-old")  # swept by the next copy
            os.replace(part, final)
        except OSError:
            pass  # placed already (another host's restore rolled it forward)
    try:
        os.unlink(os.path.join(target, PUBLISH))
    except OSError:
        pass


def wait_for_copy(target: str, bound_s: float = WAIT_S, stale_s: float = STALE_S) -> float:
    """Wait while an agent copies a save into `target` (its marker there, kept
    fresh every second): a restarted task reads the directory's newest
    checkpoint only once it is in place, the same on every host (a copy that
    died after its commit rolled forward: `finish_publish`). A marker
    whose time stops moving for STALE_S is an agent's that died. Returns the
    seconds waited."""
    marker = os.path.join(target, COPYING)
    began = time.monotonic()
    seen, moved = None, began
    while time.monotonic() - began < bound_s:
        try:
            stamp = os.stat(marker).st_mtime_ns
        except OSError:
            break
        now = time.monotonic()
        if stamp != seen:
            seen, moved = stamp, now
        elif now - moved > stale_s:
            break
        time.sleep(0.05)
    finish_publish(target)  # a copy whose agent died after its commit: whole first
    return time.monotonic() - began
