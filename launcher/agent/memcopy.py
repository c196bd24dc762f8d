"""The memory tier on a host: the job's folder in /dev/shm and the background copies.

With `checkpoint: {memory: true}` the plan gives every task MGPU_MEMORY_COPIES;
the agent then makes the job's folder (`/dev/shm/mgpu-launch-<uid>-<run>`,
0700, with the agent's pid in it) and one 0700 folder per task, named in the
task's MGPU_MEMORY_DIR. The training process saves there
(launcher/runtime/memtier.py) and tells the slot of each completed save on
its progress channel (`memory_saved`); the agent copies it to the script's
own directory on one background thread:

- every file is written aside (`.NAME.mgpu-part`), then all renamed into
  place at once as a restore sees them (launcher/agent/publish.py: a journal
  rolled forward after a crash), the files that name a checkpoint
  (TensorFlow's `checkpoint`, Keras' `training_metadata.json`) last: the
  directory only ever holds complete checkpoints, whatever dies when;
- only the newest slot of a directory is copied (an older one still waiting
  is superseded); the checkpoints a TensorFlow state file no longer lists are
  deleted after the new one is in place, as the manager would have;
- while a copy to a directory is queued or under way, the directory holds a
  marker (COPYING, refreshed every TOUCH_S), made before a task of the next
  generation starts on this host; a restarted task's restore waits for it
  (runtime/memslots.py: wait_for_copy), so a restarted generation reads the
  newest checkpoint on every host alike (its workers restore after their
  cluster formed, so after every host's starts) while its start overlaps the
  copy; the agent's end waits for the copies too, then removes the job's
  folder. The next agent removes the folders of agents that died (`sweep`).

The copies run beside the training, on the same cores: the copier thread runs
niced (19, `low_priority`), so it takes what the training leaves, yet still
gets a share on a host the training keeps busy (it is what makes a checkpoint
outlive the host); each copy's lag behind its save is reported
(`memory_copy_lag_s`) and said once when it passes LAG_NOTICE_S.

Standard library only.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

from launcher.agent import publish, saveorder
from launcher.agent.protocol import lowered_thread

SHM = "/dev/shm"  # noqa: S108 - host memory, one 0700 folder per job
PREFIX = "mgpu-launch-"
OWNER = "agent.pid"
COPIED = "copied"  # in a slot, once it is in its directory
DRAIN_S = 120.0
# In a directory while a copy to it is queued or under way, refreshed every
# TOUCH_S: a restarted task waits for it before reading that directory
# (runtime/memslots.py, COPYING: the same name), so its start need not.
COPYING = ".mgpu-copying"
TOUCH_S = 1.0
LAG_NOTICE_S = 60.0  # a copy this far behind its save is said (once)
POINTER_NAMES = ("checkpoint", "training_metadata.json")  # name a save (memslots.POINTERS)


def low_priority(batch: bool = False) -> None:
    """The calling thread runs on what the training leaves: niced to 19, and with
    `batch` at SCHED_BATCH (no preempting the training when it wakes; Linux: both
    are per thread). Nowhere else: unchanged.

    Not SCHED_IDLE: a thread of the agent's Python process holds the GIL (and,
    before protocol.Emitter's handoff, the lock of the agent's events) when it is
    taken off the CPU; at SCHED_IDLE on a host whose cores the training keeps
    busy it then waits seconds for its next turn, and every other thread of the
    agent (heartbeats, the tasks' output) with it: tests/test_agent_busy_host.py
    saw the heartbeats 4-10 s apart (the launcher gives up on an agent silent
    for 10 s). Niced, its turns come often enough that they keep their second.
    Its events go through the Emitter's handoff, started before the thread
    (MemoryCopies.before_low_thread)."""
    lowered_thread()
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, 19)
        if batch:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def job_folder(run_dir: str, host: str, shm: str = SHM) -> str:
    """One per job and host (simulated hosts share a machine)."""
    digest = _sha1(f"{os.path.abspath(run_dir)}\0{host}".encode())[:12]
    return os.path.join(shm, f"{PREFIX}{os.getuid()}-{digest}")


def _sha1(data: bytes) -> str:
    """hashlib.sha1's hex digest. Every agent names its job's folder at its
    start, memory tier or not: hashlib's OpenSSL module costs ~2.5 ms of CPU
    there, Python's own SHA-1 module ~1 ms (where the build has it)."""
    try:
        from _sha1 import sha1
    except ImportError:
        from hashlib import sha1
    return sha1(data).hexdigest()


def _shutil():
    """shutil (with bz2, lzma: ~2 ms of every agent's start), once a copy or a
    removal needs it; the memory tier is off in most jobs."""
    import shutil

    return shutil


def rmtree(path: str) -> None:
    """`shutil.rmtree(path, ignore_errors=True)`."""
    _shutil().rmtree(path, ignore_errors=True)


class MemoryCopies:
    """The job's memory folder on this host and its copier thread."""

    def __init__(self, run_dir: str, host: str, log: Callable[[str], None],
                 shm: str = SHM, notice: Callable[[str], None] | None = None) -> None:
        self.root = job_folder(run_dir, host, shm)
        self.host = host
        self.log = log
        self.notice = notice or log  # for the user: the bound, said once each
        self._copies = 0  # each task's at most (MGPU_MEMORY_COPIES); 0: no task yet
        self._sized = False
        # (task, generation, data): a copy's seconds and bytes, as the task's progress
        # (the drill's directory cost: commands/drill_memory.py); None: not told.
        self.report: Callable[[str, int, dict], None] | None = None
        self._owner: dict[str, tuple[str, int]] = {}  # slot -> the task that saved it
        self._cond = threading.Condition()
        self._failed_said: set[str] = set()  # directories whose failed copy was said
        # (target, saver) -> the saver's newest slot not yet copied: each saver of a
        # directory (a manager, a backup, a ModelCheckpoint's file) keeps its saves
        self._waiting: dict[tuple[str, tuple[str, ...]], str] = {}
        self._busy = False
        self._current = ""  # the directory being copied to
        self._thread: threading.Thread | None = None
        self._copied: dict[tuple[str, str], tuple[int, int]] = {}  # (target, name) -> source id
        self.peers = None  # the copies in another host's memory (peercopy.PeerCopies)
        self._when: dict[str, Callable[[], bool]] = {}  # slot -> copy it only if this says so
        self.peer = True  # a second copy in another host's memory (MGPU_MEMORY_PEER)
        self._lag_said = False
        # Called before a thread of the copies starts (from a thread of normal
        # priority): the agent's Emitter.start_handoff, so that a copier at low
        # priority never holds the lock of the agent's events.
        self.before_low_thread: Callable[[], None] = lambda: None

    def ensure_root(self) -> None:
        """The job's folder on this host, 0700, with this agent's pid (sweep)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.chmod(self.root, 0o700)
        with open(os.path.join(self.root, OWNER), "w", encoding="ascii") as handle:
            handle.write(str(os.getpid()))

    def task_env(self, task: str, env: dict[str, str]) -> None:
        """A task of a job with the memory tier: its folder, in its environment."""
        if not env.get("MGPU_MEMORY_COPIES"):
            return
        if not self._copies:
            self._copies = int(env["MGPU_MEMORY_COPIES"])
            self.notice(f"checkpoints in memory: {free_gb(os.path.dirname(self.root)):.1f} GB "
                        f"free in {os.path.dirname(self.root)}; at most {self._copies} copies "
                        "of each task's saves")
        self.peer = env.get("MGPU_MEMORY_PEER") != "0"  # 0: one host, or the user's
        self.ensure_root()
        folder = os.path.join(self.root, task)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        env["MGPU_MEMORY_DIR"] = folder
        env["MGPU_MEMORY_HOST"] = self.host  # the plan's name of this host, for `resumed`

    def saved(self, slot: object, task: str = "", generation: int = 0) -> None:
        """A task's save completed in memory: copy it (in the background)."""
        if not isinstance(slot, str):
            return
        path = os.path.realpath(slot)
        if not path.startswith(self.root + os.sep):
            return  # not one of this job's slots
        record = read_manifest(path)
        if record is not None and self.peers is not None:
            self.peers.saved(path, record, send=self.peer)  # said; the chief's sent on
        if record is None or not record.get("copy") or not isinstance(record.get("target"), str):
            return
        if not self._sized and record.get("kind") != "drop":  # the chief's first save: said once
            self._sized = True
            size = save_bytes(path, record)
            copies = self._copies or 1
            self.notice(f"checkpoints in memory: a copy is {_size(size)}; each task keeps at "
                        f"most {copies} ({_size(copies * size)} of /dev/shm per task)")
        self.copy_later(record["target"], path, owner=(task, generation),
                        marked=record.get("kind") != "drop")

    def copy_later(self, target: str, path: str, when: Callable[[], bool] | None = None,
                   owner: tuple[str, int] | None = None, marked: bool = True) -> None:
        """Copy the slot at `path` to `target`, on the copier thread (only if
        `when()` says so then, and only if no save of this host waits for it);
        `owner`: the task and generation that saved it (its copy's cost reported);
        `marked`: the directory marked meanwhile (COPYING: a restarted task's
        restore waits; marked before any task of the next generation starts
        here, and under the lock the copier unmarks under)."""
        key = (target, saver_of(read_manifest(path) or {}))
        with self._cond:
            if when is not None:
                if key in self._waiting:
                    return  # this host's own newer save goes there
                self._when[path] = when
            self._owner.pop(self._waiting.pop(key, ""), None)  # superseded: the same saver's
            self._waiting[key] = path
            if marked:
                mark(target)
            if owner is not None:
                self._owner[path] = owner
            if self._thread is None:
                self.before_low_thread()
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
                threading.Thread(target=self._touch, daemon=True).start()
            self._cond.notify_all()

    drain_s = DRAIN_S

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every copy asked for is done (False: timed out)."""
        deadline = time.monotonic() + (self.drain_s if timeout_s is None else timeout_s)
        with self._cond:
            while self._waiting or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout_s: float | None = None) -> None:
        """The agent's end: the copies finish, then the job's folder goes."""
        if not self.drain(timeout_s):
            self.log(f"memory tier: copies still under way after {self.drain_s:.0f} s were "
                     "given up (the checkpoint directories keep the previous checkpoint)")
        if os.path.lexists(self.root):  # none in a job without the memory tier
            _shutil().rmtree(self.root, ignore_errors=True)

    def _run(self) -> None:
        low_priority()  # niced, not idle: the copy must progress under busy training
        while True:
            with self._cond:
                while not self._waiting:
                    self._cond.wait()
                key = next(iter(self._waiting))
                target, slot = key[0], self._waiting.pop(key)
                self._busy, self._current = True, target
            try:
                self._copy(slot)
            except OSError as exc:
                if os.path.isdir(slot):  # a slot pruned meanwhile was superseded: no word
                    self.log(f"memory tier: copy of {slot} to {target} failed: {exc}")
                    self._say_failed(target, exc)
            finally:
                with self._cond:
                    self._busy, self._current = False, ""
                    if all(k[0] != target for k in self._waiting):
                        unmark(target)  # in place: a restarted task may read it
                    self._cond.notify_all()

    def _say_failed(self, target: str, exc: OSError) -> None:
        """A copy that failed, said to the user once per directory until one to it
        succeeds: the newest save is then in memory only."""
        with self._cond:
            if target in self._failed_said:
                return
            self._failed_said.add(target)
        self.notice(f"checkpoints in memory: the copy to {target} failed "
                    f"({exc.strerror or exc}): that directory keeps its previous "
                    "checkpoint; the newer saves are in this host's memory only")

    def _touch(self) -> None:
        """The markers of the copies queued or under way stay fresh (a marker
        left by an agent that died goes stale: runtime/memslots.py)."""
        while True:
            time.sleep(TOUCH_S)
            with self._cond:
                targets = {*(k[0] for k in self._waiting), self._current} - {""}
            for target in targets:
                try:
                    os.utime(os.path.join(target, COPYING))
                except OSError:
                    pass

    def _copy(self, slot: str) -> None:
        record = read_manifest(slot)
        if record is None:
            raise FileNotFoundError(slot)
        when = self._when.pop(slot, None)
        if when is not None and not when():
            return  # its directory names that save, or a newer one, already
        began = time.monotonic()
        try:
            if copy_slot(slot, record, self._copied):
                with self._cond:
                    self._failed_said.discard(str(record.get("target")))
                self._report(slot, record, time.monotonic() - began)
            else:  # late: a newer save is in its directory, kept
                with self._cond:
                    self._owner.pop(slot, None)
                self.log(f"memory tier: {slot} not copied to {record.get('target')}: the "
                         "directory holds a newer save")
        finally:  # after its report: the task's end waits for this (runtime/memtier.py),
            # and the agent's `exited` follows the events handed off before it
            with open(os.path.join(slot, COPIED), "w", encoding="ascii"):
                pass

    def _report(self, slot: str, record: dict, took: float) -> None:
        """A copy's cost, as its task's progress; its lag said once when long."""
        with self._cond:
            task, generation = self._owner.pop(slot, ("", 0))
        if task and self.report is not None and record.get("kind") != "drop":
            lag = max(0.0, time.time() - float(record.get("time") or time.time()))
            self.report(task, generation, {"memory_copy_s": round(took, 3),
                                           "memory_copy_lag_s": round(lag, 3),
                                           "memory_copy_bytes": save_bytes(slot, record)})
            if lag > LAG_NOTICE_S and not self._lag_said:
                self._lag_said = True
                self.notice(f"checkpoints in memory: the copy to {record['target']} ended "
                            f"{lag:.0f} s after the save (it runs at low CPU priority beside "
                            "the training; the shared directory lags the memory copy)")


def copy_slot(slot: str, record: dict, copied: dict[tuple[str, str], tuple[int, int]]) -> bool:
    """Copy one slot to its directory: aside then renamed, the names last. A
    worker's save published as the chief's (job/run/peerrelay.py: its chief's host
    lost) brings its own manager's state file, which may keep fewer
    checkpoints: the directory's state gets the save added instead, and keeps
    what it listed (the chief's manager prunes at its next save).

    Never over a newer save (False: not copied): the files that name a save
    (`stamped`) carry its time as their mtime, and a directory whose own are
    later holds a save made after this one (a late copy: an agent given up on
    draining its queue, a held copy published late), kept whole."""
    target, kind = record["target"], record.get("kind")
    workers = kind == "manager" and (not record.get("copy") or record.get("worker_state"))
    if kind == "drop":  # Keras removed its backup at the end of fit
        held = {"files": [n for n in os.listdir(target) if not n.startswith(".")]} \
            if os.path.isdir(target) else {}
        if saveorder.holds_any_newer(target, stamped(held), record):
            return False  # a late drop: the directory holds a later save (a later fit's)
        _shutil().rmtree(target, ignore_errors=True)
        return True
    os.makedirs(target, exist_ok=True)
    publish.sweep(target)  # a copy that died: rolled forward past its journal, else removed
    when = saved_at(record)
    if saveorder.holds_newer(target, saver_of(record), stamped(record), record):
        return False
    before = state_names(target) if kind == "manager" else set()
    try:
        staged = _stage(slot, record, target, copied, when)
        publish.stage_text(target, publish.ORDER,
                           saveorder.with_save(target, saver_of(record), record))
    except OSError:
        publish.sweep(target)  # no room (a full disk): the directory as it was, its space back
        raise
    # all at once, as a restore sees them, with the saves' order (saveorder.py)
    publish.commit(target, [*(n for n, _ in staged), publish.ORDER])
    copied.update({(target, n): ident for n, ident in staged if ident is not None})
    if kind == "manager" and not workers:
        for gone in before - state_names(target):
            for name in os.listdir(target):
                if name.startswith(gone + "."):
                    os.unlink(os.path.join(target, name))
    return True


def _stage(slot: str, record: dict, target: str, copied: dict[tuple[str, str], tuple[int, int]],
           when: float | None) -> list[tuple[str, tuple[int, int] | None]]:
    """The slot's files staged aside in `target`, in their order (the names
    last), each with its source's identity (a manager's state: None)."""
    kind, names, staged = record.get("kind"), set(stamped(record)), []
    workers = kind == "manager" and (not record.get("copy") or record.get("worker_state"))
    for name in ordered_files(record):
        if os.sep in name or name.startswith(".") or (kind == "manager" and name == "checkpoint"):
            continue  # a manager's state: written below
        source = os.path.join(slot, name)
        stat = os.stat(source)
        ident = (stat.st_ino, stat.st_mtime_ns)
        if name != "checkpoint" and copied.get((target, name)) == ident \
                and os.path.exists(os.path.join(target, name)):
            continue  # a hard link of a file copied before (an older checkpoint kept)
        publish.stage(source, target, name, when if name in names else None)
        staged.append((name, ident))
    state = os.path.join(slot, "checkpoint")
    if kind == "manager" and os.path.isfile(state):
        publish.stage_text(target, "checkpoint", merged_state(
            target, state, str(record.get("pointer") or "")) if workers
            else whole_state(state, target), when)
        staged.append(("checkpoint", None))
    return staged


def ordered_files(record: dict) -> list[str]:
    """The slot's files in the copy's order: the files that name a save last."""
    names = [n for n in record.get("files") or () if isinstance(n, str)]
    return sorted(names, key=lambda n: (n in POINTER_NAMES, n))


def saved_at(record: dict) -> float | None:
    """When the slot's save was made (the saving host's clock), if said."""
    try:
        return float(record["time"])
    except (KeyError, TypeError, ValueError):
        return None


def stamped(record: dict) -> list[str]:
    """The files of a slot that name its save: a TensorFlow state file, Keras'
    backup metadata; a save with neither (ModelCheckpoint), each of its files."""
    files = [n for n in record.get("files") or () if isinstance(n, str) and os.sep not in n]
    return [n for n in files if n in POINTER_NAMES] or files


def saver_of(record: dict) -> tuple[str, ...]:
    """Which saver of a directory made a save: its kind and the files that name
    it (a manager's state file, a backup's metadata, a ModelCheckpoint's file)."""
    return (str(record.get("kind") or ""), *stamped(record))


def _state_fields(path: str) -> list[tuple[str, str]]:
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    return [(f.strip(), v.strip()) for f, _, v in (line.partition(":") for line in lines)]


def whole_state(theirs: str, target: str) -> str:
    """The state file `theirs` less the checkpoints whose files `target` lacks,
    in place or staged with it (a manager keeping more than memory does: a save
    superseded before its copy never reached the directory): it lists whole
    checkpoints only."""
    with open(theirs, encoding="utf-8") as handle:
        text = handle.read()
    fields = _state_fields(theirs)
    paths = [v for f, v in fields if f == "all_model_checkpoint_paths"]
    stamps = [v for f, v in fields if f == "all_model_checkpoint_timestamps"]
    index = [os.path.basename(v.strip('"')) + ".index" for v in paths]  # in place, or staged
    missing = {i for i, n in enumerate(index) if not os.path.exists(os.path.join(target, n))
               and not os.path.exists(publish.aside(target, n))}
    if not missing:
        return text
    dropped = {"all_model_checkpoint_paths"} | (
        {"all_model_checkpoint_timestamps"} if len(stamps) == len(paths) else set())
    lines, seen = [], dict.fromkeys(dropped, 0)
    for field, value in fields:
        if field in dropped:
            seen[field] += 1
            if seen[field] - 1 in missing:
                continue
        if field:
            lines.append(f"{field}: {value}")
    return "\n".join(lines) + "\n"


def merged_state(target: str, theirs: str, pointer: str) -> str:
    """The directory's `checkpoint` state with `pointer` added as the newest
    (its timestamp as the state file `theirs` gave it)."""
    mine, other = _state_fields(os.path.join(target, "checkpoint")), _state_fields(theirs)
    new = f'"{pointer}"'
    their_paths = [v for f, v in other if f == "all_model_checkpoint_paths"]
    their_stamps = [v for f, v in other if f == "all_model_checkpoint_timestamps"]
    stamp = their_stamps[their_paths.index(new)] if new in their_paths and \
        len(their_stamps) == len(their_paths) else repr(time.time())
    paths = [v for f, v in mine if f == "all_model_checkpoint_paths"]
    stamps = [v for f, v in mine if f == "all_model_checkpoint_timestamps"]
    if len(stamps) != len(paths):  # none, or not one per path: written without
        stamps = [""] * len(paths)
    listed = [(v, s) for v, s in zip(paths, stamps, strict=True)
              if os.path.basename(v.strip('"')) != pointer]
    listed.append((new, stamp))
    kept = [(f, v) for f, v in mine if f == "last_preserved_timestamp"] or \
        [(f, v) for f, v in other if f == "last_preserved_timestamp"]
    lines = [f"model_checkpoint_path: {new}"]
    lines += [f"all_model_checkpoint_paths: {v}" for v, _ in listed]
    if all(s for _, s in listed):
        lines += [f"all_model_checkpoint_timestamps: {s}" for _, s in listed]
    lines += [f"{f}: {v}" for f, v in kept]
    return "\n".join(lines) + "\n"


def mark(target: str) -> None:
    try:
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, COPYING), "w", encoding="ascii"):
            pass
    except OSError:
        pass


def unmark(target: str) -> None:
    try:
        os.unlink(os.path.join(target, COPYING))
    except OSError:
        pass


def state_names(folder: str) -> set[str]:
    """The checkpoints a TensorFlow `checkpoint` state file lists (basenames)."""
    return {os.path.basename(value.strip('"'))
            for field, value in _state_fields(os.path.join(folder, "checkpoint"))
            if field in ("model_checkpoint_path", "all_model_checkpoint_paths")}


def save_bytes(slot: str, record: dict) -> int:
    """One save's size: a manager's slot also links the older checkpoints it keeps."""
    pointer = str(record.get("pointer") or "")
    names = [n for n in record.get("files") or () if isinstance(n, str) and os.sep not in n]
    if record.get("kind") == "manager" and pointer:
        names = [n for n in names if n.startswith(pointer + ".")]
    return sum(os.path.getsize(os.path.join(slot, n)) for n in names
               if os.path.isfile(os.path.join(slot, n)))


def _size(size: float) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def free_gb(folder: str) -> float:
    try:
        return _shutil().disk_usage(folder).free / 1e9
    except OSError:
        return 0.0


def read_manifest(slot: str) -> dict | None:
    try:
        with open(os.path.join(slot, "manifest.json"), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sweep(shm: str = SHM) -> list[str]:
    """Remove the memory folders of this user's agents that died (a crash)."""
    removed = []
    prefix = f"{PREFIX}{os.getuid()}-"
    for name in os.listdir(shm) if os.path.isdir(shm) else ():
        path = os.path.join(shm, name)
        if not name.startswith(prefix) or os.stat(path).st_uid != os.getuid():
            continue
        try:
            with open(os.path.join(path, OWNER), encoding="ascii") as handle:
                pid = int(handle.read().strip())
        except (OSError, ValueError):
            pid = 0
        if pid and _alive(pid) or not pid and time.time() - os.stat(path).st_mtime < 60:
            continue  # a live agent's (or one being made)
        _shutil().rmtree(path, ignore_errors=True)
        removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"launcher.agent" in handle.read()
    except OSError:
        return False
