"""The memory tier's second copy: each save also held in another host's memory.

Hosts usually reach each other only on the job's TensorFlow ports, so the
copy goes the one way every transport gives (SSH, --local, Slurm): through the
launcher, over the agents' own channels (launcher/job/run/peerrelay.py picks the
host: the next in the plan's host order). On this host's side:

- **Said, with a fingerprint.** Each slot gained is said (`memory_held`);
  in a job on several hosts with each file's size and crc32 (`fingerprint`,
  the pointer files left out), so that the launcher can tell a worker's own
  save on another host from the chief's: under MultiWorkerMirroredStrategy
  every worker saves the same weights, and a worker's save that is the
  chief's byte for byte already is its second copy (job/run/peerrelay.py).
- **Sending.** Each completed save that goes to the shared directory (the
  chief's) is offered (`peer_begin`); the launcher answers go (`peer_ack`
  with n -1) or cancels it (another host holds it already). Then it goes in
  chunks (`peer_chunk` ..., `peer_end` with each file's sha256), at most
  WINDOW chunks not yet acknowledged by the receiving agent (`peer_ack`,
  relayed): the launcher holds a bounded amount. Only the newest save of a
  directory waits (an older one still waiting is superseded). The launcher
  can ask for any slot held here (`peer_send`): a copy placed back on a host
  that needs it.
- **Receiving.** Chunks are written into `.in-<xfer>/` in the job's 0700 memory
  folder, hashed as they come; at `peer_end` the sizes and sha256 must match,
  then the slot gets its manifest (with the checksums, `origin`: the host
  that saved it, `held_by`: the host it came from) and is renamed to
  `peer-<origin>/s-<seq>/`. At most `keep` (memory_copies) per origin host.
  A restore verifies the checksums (runtime/memslots.py) before it reads one.
- **Publishing.** After the chief's host is lost its copy to the shared
  directory may not have finished: `peer_publish` copies a held slot there
  (memcopy.copy_slot: aside, then renamed) when the directory names an older
  checkpoint, so every worker restores the same, newest one.

Both sides run on threads niced to 19 at SCHED_BATCH (memcopy.low_priority:
not SCHED_IDLE, which held the agent's other threads behind it): the second
copy takes what the training leaves, with a small share on a host the
training keeps busy; its events go out through the Emitter's handoff
(protocol.py), never holding the lock of the agent's other events. A
chunk travels as a frame (protocol.py: a header line, then its raw bytes; the
launcher forwards the bytes as they came); hashed once, while read, and again
as written at the receiver. A job on one host (MGPU_MEMORY_PEER=0) sends none.

Every slot this host gains is said (`memory_held`), so the launcher knows what
each host holds. The folders live in the job's memory folder: removed with it
at the job's end, and by the next agent after a crash (memcopy.sweep).

Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import threading

from launcher.agent import memcopy
from launcher.agent.protocol import Emitter

CHUNK = 512 * 1024  # raw bytes a chunk (a frame: at most protocol.MAX_FRAME_BYTES)
WINDOW = 8  # chunks in flight (4 MiB): what the launcher may hold of one copy
ACK_WAIT_S = 60.0  # a receiver that stops acknowledging: the copy is given up
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
PEER = "peer-"
_HELD = ("key", "kind", "pointer", "step", "time", "copy", "origin", "target")
POINTERS = ("checkpoint", "training_metadata.json")  # name the rest; written apart per worker


def _plain(value: object) -> str:
    if not isinstance(value, str) or not NAME.fullmatch(value):
        raise ValueError(f"not a plain name: {str(value)[:60]!r}")
    return value


def held(slot: str, record: dict, host: str) -> dict:
    """What `memory_held` says of a slot."""
    fields = {k: record.get(k) for k in _HELD}
    fields["origin"] = record.get("origin") or host
    return {"slot": slot, **fields}


def sent_names(record: dict) -> list[str]:
    """The files of a slot that make its save: a manager's named checkpoint
    only, not the older ones its working folder keeps."""
    names = [str(n) for n in record.get("files") or () if NAME.fullmatch(str(n))]
    if record.get("kind") == "manager":
        pointer = os.path.basename(str(record.get("pointer") or ""))
        names = [n for n in names if n == "checkpoint" or n.startswith(pointer + ".")]
    return names


def fingerprint(slot: str, record: dict) -> dict[str, list[int]]:
    """Each file's size and crc32, the pointer files left out (a worker's
    `checkpoint` file differs from the chief's by its timestamps; the pointer
    itself is compared as a field). ~0.3 ms of CPU per MB (zlib's crc32),
    against ~1.8 ms per MB for sending a copy through the launcher. A
    TensorFlow checkpoint's data files are not read (crc -1): its `.index`
    holds each tensor's crc32c (TensorBundle), so the index's bytes and the
    data files' sizes stand for them, at a few KB read per save."""
    import zlib

    buffer = bytearray(2**20)
    view = memoryview(buffer)
    sums: dict[str, list[int]] = {}
    names = sent_names(record)
    indexed = record.get("kind") == "manager" and any(n.endswith(".index") for n in names)
    for name in names:
        if name in POINTERS:
            continue
        if indexed and not name.endswith(".index"):
            sums[name] = [os.path.getsize(os.path.join(slot, name)), -1]
            continue
        size, crc = 0, 0
        with open(os.path.join(slot, name), "rb", buffering=0) as handle:
            while read := handle.readinto(buffer):
                crc = zlib.crc32(view[:read], crc)
                size += read
        sums[name] = [size, crc]
    return sums


class _Work:
    """The sending thread's next job: say a slot (with its fingerprint), then
    send it (`xfer`; None: said only). A plain class: `dataclasses` (with
    `inspect`, `ast`, `dis`) costs ~12 ms of CPU at every host's agent start."""

    __slots__ = ("slot", "xfer", "record", "routine", "as_copy_of")

    def __init__(self, slot: str, xfer: str | None, record: dict | None = None,
                 routine: bool = True, as_copy_of: str = "") -> None:
        self.slot, self.xfer = slot, xfer
        self.record = record  # said first (memory_held) when given
        self.routine = routine  # a save's own copy (superseded by a newer one), not a placement
        self.as_copy_of = as_copy_of  # a worker's save placed as a copy of the chief's there


class _Incoming:
    """One copy being received: its folder, files, hashes and position."""

    def __init__(self, folder: str, message: dict) -> None:
        self.folder = folder
        self.record = dict(message.get("manifest") or {})
        self.files = [(_plain(n), int(s)) for n, s in message.get("files") or ()]
        self.origin = _plain(self.record.get("origin") or message.get("from_host"))
        self.held_by = str(message.get("from_host") or "")
        self.keep = max(1, int(message.get("keep") or 2))
        self.index, self.written, self.next = 0, 0, 0
        import hashlib  # here: every agent imports this module at its start

        self.hashes = {name: hashlib.sha256() for name, _ in self.files}
        self.fd: int | None = None
        os.makedirs(folder, mode=0o700, exist_ok=True)  # made at `peer_expect`, perhaps
        for name in os.listdir(folder):  # what an earlier try left
            os.unlink(os.path.join(folder, name))

    def write(self, n: int, name: str, data: bytes) -> None:
        if n != self.next:
            raise ValueError(f"chunk {n} where {self.next} was due")
        while self.index < len(self.files) and self.files[self.index][0] != name:
            if self.written != self.files[self.index][1]:
                raise ValueError(f"{self.files[self.index][0]} ended short")
            self.index, self.written = self.index + 1, 0
            self.close()
        if self.index >= len(self.files) or self.written + len(data) > self.files[self.index][1]:
            raise ValueError(f"{name}: more bytes than announced")
        if self.fd is None:
            self.fd = os.open(os.path.join(self.folder, name),
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self.fd, data)
        self.hashes[name].update(data)
        self.written += len(data)
        self.next += 1

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def finish(self, sums: dict) -> dict:
        """Checked: every file whole and as hashed at the source."""
        self.close()
        for name, size in self.files:
            path = os.path.join(self.folder, name)
            if (os.path.getsize(path) if os.path.exists(path) else -1) != size:
                if size or os.path.exists(path):
                    raise ValueError(f"{name}: size differs")
                open(path, "wb").close()  # an empty file sends no chunk
                os.chmod(path, 0o600)
            if self.hashes[name].hexdigest() != sums.get(name):
                raise ValueError(f"{name}: sha256 differs from the source's")
        return {**self.record, "files": [n for n, _ in self.files], "origin": self.origin,
                "held_by": self.held_by, "peer": True, "sha256": dict(sums)}


class PeerCopies:
    """This host's side of the copies in another host's memory."""

    def __init__(self, memory: memcopy.MemoryCopies, host: str,
                 emit: Emitter) -> None:
        self.memory = memory
        self.host = host
        self.emit = emit
        self._cond = threading.Condition()
        self._queue: list[_Work] = []
        self._acked: dict[str, int] = {}  # xfer -> the last chunk acknowledged (-1: go)
        self._cancelled: dict[str, str] = {}  # xfer -> why
        self._sending: str | None = None  # the copy under way (its answers are kept)
        self._incoming: dict[str, _Incoming] = {}
        self._count = 0
        self._chief_here = False  # the chief's saves are made here: workers' need no fingerprint
        self._saves_said: list[tuple] = []  # the saves whose first slot was said with one
        self._thread: threading.Thread | None = None
        self._inbox: list[tuple[str, str, dict]] = []  # received: (op, xfer, message)
        self._receiver: threading.Thread | None = None

    # --- what happens here --------------------------------------------------

    def saved(self, slot: str, record: dict, send: bool = True) -> None:
        """A task's save completed in memory: said, and (the chief's) offered
        to another host, unless `send` is False (no other host: said at once,
        without a fingerprint)."""
        if not send or record.get("kind") == "drop":
            self.emit("memory_held", **held(slot, record, self.host))
            return
        xfer = None
        if record.get("copy"):
            self._count += 1
            xfer = f"{self.host}-{self._count}"
            self._chief_here = True
        elif self._chief_here or not self._first_of_save(record):
            # A worker's save beside the chief's, or a second worker's here: it
            # never stands for the chief's (one per other host is enough).
            self.emit("memory_held", **held(slot, record, self.host))
            return
        self._enqueue(_Work(slot, xfer, record))

    def _first_of_save(self, record: dict) -> bool:
        """The first slot of this save said here (the last few saves kept)."""
        save = (record.get("key"), record.get("kind"), record.get("pointer"), record.get("step"))
        if save in self._saves_said:
            return False
        self._saves_said = [*self._saves_said[-7:], save]
        return True

    def handle(self, op: str, message: dict) -> None:
        """A `peer_*` command from the launcher."""
        xfer = _plain(message.get("xfer"))
        if op == "peer_ack":
            with self._cond:
                if xfer != self._sending:
                    return  # a late one, for a copy that ended
                if message.get("cancel"):
                    self._cancelled[xfer] = str(message.get("why") or "no host to copy to")
                else:
                    self._acked[xfer] = max(self._acked.get(xfer, -1), int(message["n"]))
                self._cond.notify_all()
        elif op == "peer_send":
            try:
                self._enqueue(_Work(self._own_slot(message.get("slot")), xfer, routine=False,
                                    as_copy_of=str(message.get("as_copy_of") or "")))
            except ValueError as exc:  # the receiver says so, and the launcher waits no more
                self.emit("peer_end", xfer=xfer, error=str(exc))
        elif op == "peer_publish":
            self._publish(xfer, message.get("slot"))
        elif op == "peer_expect":  # a copy placed here for a restore: the restore waits for it
            self.memory.ensure_root()
            os.makedirs(os.path.join(self.memory.root, f".in-{xfer}"), mode=0o700,
                        exist_ok=True)
        else:  # on the receiver's thread, in order (the command thread stays free)
            with self._cond:
                self._inbox.append((op, xfer, message))
                if self._receiver is None:
                    self.memory.before_low_thread()
                    self._receiver = threading.Thread(target=self._receive_loop, daemon=True)
                    self._receiver.start()
                self._cond.notify_all()

    # --- sending ----------------------------------------------------------------

    def _own_slot(self, slot: object) -> str:
        path = os.path.realpath(str(slot))
        if not path.startswith(self.memory.root + os.sep) or \
                memcopy.read_manifest(path) is None:
            raise ValueError(f"no such slot here: {str(slot)[:120]}")
        return path

    def _enqueue(self, work: _Work) -> None:
        with self._cond:
            if work.routine and work.xfer:  # the newest save of a directory is what matters
                for waiting in self._queue:
                    waiting.xfer = None if waiting.routine else waiting.xfer
                self._queue = [w for w in self._queue if w.xfer or w.record]
            self._queue.append(work)
            if self._thread is None:
                self.memory.before_low_thread()
                self._thread = threading.Thread(target=self._run, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        memcopy.low_priority(batch=True)
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                work = self._queue.pop(0)
            if work.record is not None:
                self._say(work.slot, work.record)
            if work.xfer is None:
                continue
            with self._cond:
                self._sending = work.xfer
            try:
                self._send(work.xfer, work.slot, work.as_copy_of)
            except (OSError, ValueError, TimeoutError) as exc:
                self.emit("peer_end", xfer=work.xfer, error=f"{type(exc).__name__}: {exc}")
            finally:
                with self._cond:
                    self._sending = None
                    self._acked.clear()
                    self._cancelled.clear()

    def _say(self, slot: str, record: dict) -> None:
        try:
            sums = fingerprint(slot, record)
        except OSError:  # pruned meanwhile: said without one (it matches nothing)
            sums = None
        self.emit("memory_held", **held(slot, record, self.host), fingerprint=sums)

    def _send(self, xfer: str, slot: str, as_copy_of: str = "") -> None:
        record = memcopy.read_manifest(slot)
        if record is None:
            raise FileNotFoundError(slot)
        names = sent_names(record)
        files = [[n, os.path.getsize(os.path.join(slot, n))] for n in names]
        record.update(origin=record.get("origin") or self.host, files=names)
        if as_copy_of:  # a worker's save, the same bytes: held as a copy of the chief's,
            # its state file its own manager's (memcopy.copy_slot merges it)
            record.update(copy=True, origin=as_copy_of, worker_state=True)
        self.emit("peer_begin", xfer=xfer, slot=slot, manifest=record, files=files)
        self._wait_window(xfer, -1)  # the launcher's go: no other host holds it yet
        import hashlib

        sums, n = {}, 0
        for name in names:
            digest = hashlib.sha256()
            with open(os.path.join(slot, name), "rb") as handle:
                while data := handle.read(CHUNK):
                    digest.update(data)
                    self._wait_window(xfer, n)
                    self._chunk(xfer, n, name, data)
                    n += 1
            sums[name] = digest.hexdigest()
        self.emit("peer_end", xfer=xfer, sha256=sums)

    def _chunk(self, xfer: str, n: int, name: str, data: bytes) -> None:
        """One `peer_chunk`: a frame, the bytes as they are after a short header
        line (protocol.py; no base64, no JSON pass over them)."""
        self.emit.frame("peer_chunk", data, xfer=xfer, n=n, file=name)

    def _wait_window(self, xfer: str, n: int) -> None:
        """Until chunk `n` may go (-1: the launcher's go, before the first)."""
        with self._cond:
            ok = self._cond.wait_for(lambda: xfer in self._cancelled or (
                xfer in self._acked and self._acked[xfer] >= n - WINDOW), ACK_WAIT_S)
            if xfer in self._cancelled:
                raise ValueError(f"cancelled by the launcher ({self._cancelled[xfer]})")
            if not ok:
                raise TimeoutError(f"no acknowledgement in {ACK_WAIT_S:.0f} s")

    # --- receiving --------------------------------------------------------------

    def _receive_loop(self) -> None:
        memcopy.low_priority(batch=True)
        while True:
            with self._cond:
                while not self._inbox:
                    self._cond.wait()
                op, xfer, message = self._inbox.pop(0)
            try:
                self._receive(op, xfer, message)
            except Exception as exc:  # noqa: BLE001 - the thread must go on for the next copy
                self.emit("log", text=f"memory tier: {op} {xfer}: {type(exc).__name__}: {exc}")

    def _receive(self, op: str, xfer: str, message: dict) -> None:
        try:
            if op == "peer_begin":
                self.memory.ensure_root()
                self._drop(xfer)
                self._incoming[xfer] = _Incoming(os.path.join(self.memory.root, f".in-{xfer}"),
                                                 message)
            elif op == "peer_chunk":
                incoming = self._incoming[xfer]
                data = message.get("raw")
                if not isinstance(data, bytes):  # a line, not a frame
                    raise TypeError("a chunk without its bytes")
                incoming.write(int(message["n"]), _plain(message.get("file")), data)
                self.emit("peer_ack", xfer=xfer, n=incoming.next - 1)
            elif op == "peer_end":
                self._store(xfer, self._incoming.pop(xfer), message)
        except (KeyError, ValueError, TypeError, OSError) as exc:
            self._drop(xfer)
            self.emit("peer_stored", xfer=xfer, ok=False,
                      error=f"{type(exc).__name__}: {exc}"[:500])

    def _store(self, xfer: str, incoming: _Incoming, message: dict) -> None:
        if message.get("error"):
            raise ValueError(f"the source gave up: {message['error']}")
        record = incoming.finish(message.get("sha256") or {})
        with open(os.path.join(incoming.folder, "manifest.json"), "w",
                  encoding="utf-8") as handle:
            json.dump(record, handle)
        os.chmod(os.path.join(incoming.folder, "manifest.json"), 0o600)
        store = os.path.join(self.memory.root, PEER + incoming.origin)
        os.makedirs(store, mode=0o700, exist_ok=True)
        numbers = [int(n[2:]) for n in os.listdir(store) if n[2:].isdigit()]
        slot = os.path.join(store, f"s-{max(numbers, default=0) + 1:08d}")
        os.replace(incoming.folder, slot)
        for old in sorted(n for n in os.listdir(store) if n[2:].isdigit())[:-incoming.keep]:
            memcopy.rmtree(os.path.join(store, old))
        self.emit("peer_stored", xfer=xfer, ok=True, slot=slot)
        self.emit("memory_held", **held(slot, record, self.host))

    def _drop(self, xfer: str) -> None:
        incoming = self._incoming.pop(xfer, None)
        if incoming is not None:
            incoming.close()
        memcopy.rmtree(os.path.join(self.memory.root, f".in-{xfer}"))

    # --- publishing -------------------------------------------------------------

    def _publish(self, xfer: str, slot: object) -> None:
        """Copy a held slot to its directory when that names an older checkpoint:
        queued now (its directory marked: a restore waits for it, memcopy.py), checked on
        the copier thread (after the copies before it), answered once done."""
        try:
            path = self._own_slot(slot)
            record = memcopy.read_manifest(path) or {}
            self.memory.copy_later(str(record["target"]), path,
                                   when=lambda: newer_than_directory(record))
        except (OSError, ValueError, KeyError) as exc:
            self.emit("peer_done", xfer=xfer, ok=False, done=f"{type(exc).__name__}: {exc}")
            return

        def answer() -> None:
            done = "copied if older" if self.memory.drain() else "not copied in time"
            self.emit("peer_done", xfer=xfer, ok=True, done=done)
        threading.Thread(target=answer, daemon=True).start()


def _order(kind: object, pointer: str) -> tuple[int, ...] | None:
    """A save's place in its series: `ckpt-N` (a manager's), or Keras' backup
    metadata's epoch and batch."""
    if kind == "manager":
        found = re.search(r"-(\d+)$", os.path.basename(pointer or ""))
        return (int(found.group(1)),) if found else None
    try:
        data = json.loads(pointer)
        return (int(data.get("epoch", -1)), int(data.get("batch", -1)))
    except (ValueError, TypeError, AttributeError):
        return None


def newer_than_directory(record: dict) -> bool:
    """The slot's save is newer than what its directory names (or it names none)."""
    target, kind = str(record.get("target") or ""), record.get("kind")
    mine = _order(kind, str(record.get("pointer") or ""))
    if mine is None or not target:
        return False
    if kind == "manager":
        names = memcopy.state_names(target)
        latest = max((o for o in (_order(kind, n) for n in names) if o), default=None)
    else:
        try:
            with open(os.path.join(target, "training_metadata.json"), encoding="utf-8") as h:
                latest = _order(kind, h.read())
        except OSError:
            latest = None
    return latest is None or mine > latest
