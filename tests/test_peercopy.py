"""The memory tier's copies on other hosts (launcher/agent/peercopy.py and
launcher/job/run/peerrelay.py), wired as the launcher wires them but in one
process: two hosts' agents' parts talk through the relay. A chief's save
reaches the neighbour's memory whole, checksummed and private; a copy altered
there fails its check; a worker's own save on another host that is the
chief's byte for byte is its second copy (nothing sent; said while the copy is
under way, the copy ends at both ends), one that differs is not; before a
restart a host that lost its memory gets the newest save placed back, and a
directory left behind gets it published; a restore reads whichever is
complete first, the placed copy or the directory."""

from __future__ import annotations

import io
import json
import os
import queue
import shutil
import stat
from pathlib import Path

from launcher.agent import memcopy
from launcher.agent.peercopy import PeerCopies, newer_than_directory
from launcher.agent.protocol import MAX_FRAME_BYTES, frame_head, frame_size, read_frame
from launcher.job.record import events as ev
from launcher.job.run.peerrelay import PeerRelay
from launcher.runtime import memslots, nearest
from launcher.transport import AgentMessage
from tests.test_memcopy import make_slot


class Link:
    """An agent's pipe as the relay sees it: commands queued for that agent."""

    def __init__(self, host: str, wire: queue.Queue) -> None:
        self.host, self.wire, self.closed, self.link_id = host, wire, False, 0
        self.lines = 0
        self.ops: list[str] = []  # every command sent, in order

    def send(self, command: dict) -> bool:
        self.ops.append(str(command.get("op")))
        self.wire.put(("op", self.host, command))
        return True

    def send_frame(self, command: dict, payload: bytes) -> bool:  # a chunk, forwarded
        self.lines += 1
        return self.send(through_the_wire(frame_head(len(payload), command), payload))


class Emit:
    """An agent's emitter as the relay hears it; a chunk is a frame."""

    def __init__(self, host: str, wire: queue.Queue) -> None:
        self.host, self.wire, self.lines = host, wire, 0

    def __call__(self, event: str, **fields) -> None:
        self.wire.put(("ev", self.host, {"ev": event, **fields}))

    def frame(self, event: str, payload: bytes, **fields) -> None:
        self.lines += 1
        head = frame_head(len(payload), {"ev": event, **fields})
        self.wire.put(("ev", self.host, through_the_wire(head, payload)))


def through_the_wire(head: bytes, payload: bytes) -> dict:
    """A frame as its reader makes it a message: written, then read back
    (header line, its size, its bytes; the bytes are `raw`)."""
    stream = io.BytesIO(head + payload + b'{"next": "line"}\n')
    line = stream.readline()
    assert line == head and line.endswith(b"\n") and line.count(b"\n") == 1
    size = frame_size(line)
    message = json.loads(line) | {"raw": read_frame(stream, size, MAX_FRAME_BYTES)}
    assert message["raw"] == payload and stream.readline() == b'{"next": "line"}\n'
    return message


HOLD = 0.3


class Hosts:
    """Agents' memory parts per host, the relay between them, one pump."""

    def __init__(self, tmp: Path, names: list[str], hold_s: float = HOLD) -> None:
        self.tmp, self.wire = tmp, queue.Queue()
        self.told: list[ev.Event] = []
        self.links = {h: Link(h, self.wire) for h in names}
        # A chief's save waits `hold_s` (not 10 s) for a worker's save to cover it.
        self.relay = PeerRelay(lambda: self.links, self.told.append, hold_s=hold_s)
        self.relay.use_plan(names, 2)
        self.peers = {h: self.agent(h) for h in names}

    def agent(self, host: str) -> PeerCopies:
        shm = self.tmp / "shm"
        shm.mkdir(exist_ok=True)
        memory = memcopy.MemoryCopies(str(self.tmp / "run" / host), host, print, shm=str(shm))
        peers = PeerCopies(memory, host, Emit(host, self.wire))
        memory.peers = peers
        return peers

    def pump(self, until, limit: int = 10_000) -> None:
        for _ in range(limit):
            if until():
                return
            self.step(10)
        raise AssertionError("the copies did not settle")

    def step(self, timeout: float) -> bool:
        """One message delivered (an event to the relay, a command to its
        agent; the relay's clock looked at, as the supervisor's loop does);
        False (the relay's `pump`: no stop) either way."""
        self.relay.tick()
        try:
            item = self.wire.get(timeout=min(timeout, HOLD / 3))
        except queue.Empty:
            return False
        self.deliver(item)
        return False

    def deliver(self, item: tuple[str, str, dict]) -> None:
        kind, host, body = item
        if kind == "ev":
            self.relay.consumed(AgentMessage(host, body))
        else:
            self.peers[host].handle(body["op"], body)

    def deliver_first(self, match) -> None:
        """The first message that `match`es, as soon as it is on the wire,
        delivered ahead of those queued before it (which then follow in order)."""
        ahead = []
        while not match(item := self.wire.get(timeout=10)):
            ahead.append(item)
        self.deliver(item)
        for item in ahead:
            self.deliver(item)


def saved_before(state: Path) -> None:
    """A state file written by hand stands for an older save's: its mtime that
    save's time (the slots here are saved at `time` 1, 2, ...: memcopy.copy_slot
    copies nothing over a newer save)."""
    os.utime(state, (0.5, 0.5))


def chief_slot(hosts: Hosts, host: str, seq: int, size: int, target: Path,
               task: str = "worker0") -> Path:
    env = {"MGPU_MEMORY_COPIES": "2"}
    hosts.peers[host].memory.task_env(task, env)
    slot = make_slot(Path(env["MGPU_MEMORY_DIR"]), seq, f"ckpt-{seq}", size, [f"ckpt-{seq}"])
    (slot / "ckpt-0.index").write_bytes(b"an older checkpoint the manager keeps")
    record = memslots.manifest(str(slot)) | {"target": str(target), "step": seq * 10,
                                             "time": float(seq), "copy": task == "worker0"}
    record["files"] = memslots.ordered([*record["files"], "ckpt-0.index"])
    memslots.seal(str(slot), record)
    return slot


def test_a_save_reaches_the_neighbours_memory_whole_private_and_checked(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"])
    slot = chief_slot(hosts, "host0", 1, 3_000_000, tmp_path / "shared")
    hosts.peers["host0"].memory.saved(str(slot))
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) for e in hosts.told)
               and hosts.wire.empty())
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert (told.host, told.source, told.origin, told.checkpoint, told.error) == (
        "host1", "host0", "host0", "ckpt-1", None), told
    store = Path(hosts.peers["host1"].memory.root) / "peer-host0"
    [copy] = memslots.slots(str(store))
    record = memslots.manifest(copy[1])
    # The checkpoint the save names, not the older ones its manager keeps.
    assert record["held_by"] == "host0" and record["peer"] and set(record["sha256"]) == {
        "checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001"} == set(record["files"])
    for name in record["files"]:
        assert (Path(copy[1]) / name).read_bytes() == (slot / name).read_bytes()
        assert stat.S_IMODE((Path(copy[1]) / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(store.stat().st_mode) == 0o700
    # The restore's check: an altered byte and the copy is not read.
    assert memslots.verified(copy[1], record)
    data = Path(copy[1]) / "ckpt-1.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[1000] ^= 1
    data.write_bytes(bytes(raw))
    assert not memslots.verified(copy[1], record)
    assert memslots.matching([str(store)], "k", "manager", "ckpt-1", {}) is None
    # The copies ran on what the training leaves: the directory's niced, the
    # second copy's sending and receiving niced and at SCHED_BATCH (Linux: per
    # thread; not SCHED_IDLE: memcopy.low_priority).
    sender, receiver = hosts.peers["host0"], hosts.peers["host1"]
    assert sender.emit.lines == hosts.links["host1"].lines == 8  # 3 files, 3 MB: chunks
    assert priority(sender._thread) == priority(receiver._receiver) == (19, SCHED_BATCH)
    hosts.peers["host0"].memory.drain(5)
    assert priority(hosts.peers["host0"].memory._thread) == (19, 0)  # SCHED_OTHER
    # Both hosts' slots are known to the launcher; a folder's removal takes them all.
    assert set(hosts.relay.held) == {"host0", "host1"}
    hosts.peers["host1"].memory.close(timeout_s=1)
    assert not os.path.exists(hosts.peers["host1"].memory.root)


SCHED_BATCH = 3


def priority(thread) -> tuple[int, int]:
    """A thread's nice and scheduling policy, as `ps -L -o ni,cls` shows them."""
    stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[16]), int(fields[38])


def test_a_job_on_one_host_sends_no_copy_to_another(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0"])
    env = {"MGPU_MEMORY_COPIES": "2", "MGPU_MEMORY_PEER": "0"}  # as the plan sets it
    hosts.peers["host0"].memory.task_env("worker0", env)
    slot = make_slot(Path(env["MGPU_MEMORY_DIR"]), 1, "ckpt-1", 3_000_000, ["ckpt-1"])
    memslots.seal(str(slot), memslots.manifest(str(slot)) | {"target": str(tmp_path / "d")})
    hosts.peers["host0"].memory.saved(str(slot))
    assert hosts.peers["host0"].memory.drain(10)
    said = [hosts.wire.get_nowait()[2]["ev"] for _ in range(hosts.wire.qsize())]
    assert said == ["memory_held"], said  # the launcher knows it; nothing is sent
    assert hosts.peers["host0"]._thread is None


def worker_slot(hosts: Hosts, host: str, chief: Path, target: Path, change: bool) -> Path:
    """worker1's own save of the chief's step on `host`: the same checkpoint
    files (with `change`, a tensor of its own: a byte of the data file and of
    the index, which holds each tensor's crc32c), its own state file (the
    manager writes its own timestamps there)."""
    slot = chief_slot(hosts, host, int(chief.name[2:]), 10, target, task="worker1")
    for source in chief.iterdir():
        if source.name not in ("checkpoint", "manifest.json"):
            shutil.copyfile(source, slot / source.name)
    (slot / "checkpoint").write_text((chief / "checkpoint").read_text()
                                     + "last_preserved_timestamp: 1764300000.5\n")
    if change:  # a tensor of its own: its bytes, and its crc32c in the index
        seq = int(chief.name[2:])
        for changed in (slot / f"ckpt-{seq}.data-00000-of-00001", slot / f"ckpt-{seq}.index"):
            raw = bytearray(changed.read_bytes())
            raw[-1] ^= 1
            changed.write_bytes(bytes(raw))
    return slot


def test_a_workers_own_save_on_another_host_is_the_chiefs_second_copy(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"], hold_s=60)  # the offer waits for the worker
    shared = tmp_path / "shared"
    chief = chief_slot(hosts, "host0", 1, 3_000_000, shared)
    worker = worker_slot(hosts, "host1", chief, shared, change=False)
    (worker / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n'  # keeps one
                                       'all_model_checkpoint_paths: "ckpt-1"\n'
                                       "all_model_checkpoint_timestamps: 1764300000.5\n")
    hosts.peers["host0"].memory.saved(str(chief))  # the chief's first: its offer waits
    hosts.peers["host1"].memory.saved(str(worker))
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) for e in hosts.told)
               and hosts.wire.empty())
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert (told.host, told.source, told.checkpoint, told.covered_by, told.bytes,
            told.error) == ("host1", "host0", "ckpt-1", "worker1", 0, None), told
    # Not a byte of it sent; host1 holds no copy beside its own save.
    assert hosts.peers["host0"].emit.lines == hosts.links["host1"].lines == 0
    assert not (Path(hosts.peers["host1"].memory.root) / "peer-host0").exists()
    assert hosts.relay.held["host1"][str(worker)]["covers"]
    # host0 dies before its copy to the directory ended: host1's save is the newest
    # the job holds; it is published there and placed in host0's new memory.
    hosts.peers["host0"].memory.drain(5)
    # What the directory holds then: the chief's older checkpoints (its manager
    # keeps two; worker1's one), its copy of ckpt-1 not there yet.
    for name in [*(shared / n for n in os.listdir(shared))]:
        name.unlink()
    for name in ("ckpt-0.index", "ckpt-0.data-00000-of-00001"):
        (shared / name).write_bytes(b"the chief's older checkpoint")
    (shared / "checkpoint").write_text('model_checkpoint_path: "ckpt-0"\n'
                                       'all_model_checkpoint_paths: "ckpt-0"\n'
                                       "all_model_checkpoint_timestamps: 1764299000.0\n"
                                       "last_preserved_timestamp: 1764298000.0\n")
    saved_before(shared / "checkpoint")
    hosts.relay.forget("host0")
    shutil.rmtree(hosts.peers["host0"].memory.root)
    hosts.peers["host0"] = hosts.agent("host0")
    hosts.relay.prepare(["host0", "host1"], lambda: hosts.step(0.1))
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) and e.placed for e in hosts.told)
               and hosts.wire.empty())
    [placed] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy) and e.placed]
    assert (placed.host, placed.source, placed.origin, placed.checkpoint, placed.error) == (
        "host0", "host1", "host0", "ckpt-1", None), placed
    found = memslots.matching(memslots.settled_roots(
        str(Path(hosts.peers["host0"].memory.root) / "worker0"), 1), "k", "manager",
        "ckpt-1", {})
    # Held on host0 as a copy of the chief's save: a later restart counts it.
    record = memslots.manifest(found) if found else {}
    assert (record.get("held_by"), record.get("copy"), record.get("origin")) == (
        "host1", True, "host0"), record
    hosts.peers["host1"].memory.drain(5)
    for name in ("ckpt-1.index", "ckpt-1.data-00000-of-00001"):
        assert (shared / name).read_bytes() == (worker / name).read_bytes()
    # The directory names it, and still lists (and holds) the chief's older one.
    assert (shared / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-1"\n'
        'all_model_checkpoint_paths: "ckpt-0"\nall_model_checkpoint_paths: "ckpt-1"\n'
        "all_model_checkpoint_timestamps: 1764299000.0\n"
        "all_model_checkpoint_timestamps: 1764300000.5\n"
        "last_preserved_timestamp: 1764298000.0\n")
    assert (shared / "ckpt-0.data-00000-of-00001").read_bytes() == (
        b"the chief's older checkpoint") and (shared / "ckpt-0.index").exists()


def test_a_workers_save_that_differs_from_the_chiefs_is_no_copy_of_it(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"])
    chief = chief_slot(hosts, "host0", 1, 3_000_000, tmp_path / "shared")
    worker = worker_slot(hosts, "host1", chief, tmp_path / "shared", change=True)
    hosts.peers["host1"].memory.saved(str(worker))
    hosts.peers["host0"].memory.saved(str(chief))
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) for e in hosts.told)
               and hosts.wire.empty())
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert (told.host, told.covered_by, told.error) == ("host1", None, None), told
    assert told.bytes > 3_000_000 and hosts.links["host1"].lines == 8
    [copy] = memslots.slots(str(Path(hosts.peers["host1"].memory.root) / "peer-host0"))
    assert (Path(copy[1]) / "ckpt-1.data-00000-of-00001").read_bytes() == (
        chief / "ckpt-1.data-00000-of-00001").read_bytes()
    assert not hosts.relay.held["host1"][str(worker)].get("covers")


def test_a_worker_save_said_after_the_go_ends_the_copy_under_way(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"], hold_s=0)  # the offer goes at once
    shared = tmp_path / "shared"
    # Large enough (60 chunks) that the worker's fingerprint (its index only)
    # is said while the copy is under way.
    chief = chief_slot(hosts, "host0", 1, 30_000_000, shared)
    worker = worker_slot(hosts, "host1", chief, shared, change=False)
    sender = hosts.peers["host0"]
    sender.memory.saved(str(chief))
    hosts.pump(lambda: hosts.links["host1"].lines >= 1)  # its first chunk reached host1
    hosts.peers["host1"].memory.saved(str(worker))  # the same save, said late
    receiver = hosts.peers["host1"]
    root = Path(receiver.memory.root)
    # Ended at both ends: the sender free, what reached host1 dropped (its
    # receiving thread told to).
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) for e in hosts.told)
               and sender._sending is None and hosts.wire.empty() and not receiver._inbox
               and not receiver._incoming and not list(root.glob(".in-*")), limit=300)
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert (told.host, told.source, told.covered_by, told.bytes, told.error) == (
        "host1", "host0", "worker1", 0, None), told
    assert hosts.links["host1"].lines >= 1  # it was under way: host1 had chunks of it
    # What of it reached host1 is dropped; host1 holds its own save, as the copy.
    assert memslots.slots(str(root / "peer-host0")) == []
    assert hosts.relay.held["host1"][str(worker)]["covers"]


def test_a_copy_whose_bytes_all_went_is_let_finish_when_a_worker_save_covers_it(
        tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"], hold_s=0)
    shared = tmp_path / "shared"
    chief = chief_slot(hosts, "host0", 1, 3_000_000, shared)
    worker = worker_slot(hosts, "host1", chief, shared, change=False)
    hosts.peers["host0"].memory.saved(str(chief))
    hosts.pump(lambda: "peer_end" in hosts.links["host1"].ops)  # the source's last word went
    hosts.peers["host1"].memory.saved(str(worker))
    # The worker's save reaches the relay before host1 has stored the copy.
    hosts.deliver_first(lambda item: item[2].get("ev") == "memory_held" and item[1] == "host1")
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) for e in hosts.told)
               and hosts.wire.empty())
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert (told.host, told.covered_by, told.error) == ("host1", None, None), told
    assert told.bytes > 3_000_000
    [copy] = memslots.slots(str(Path(hosts.peers["host1"].memory.root) / "peer-host0"))
    assert (Path(copy[1]) / "ckpt-1.data-00000-of-00001").read_bytes() == (
        chief / "ckpt-1.data-00000-of-00001").read_bytes()


def test_an_offer_whose_destination_is_lost_lets_its_sender_go_on(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"], hold_s=60)
    sender = hosts.peers["host0"]
    sender.memory.saved(str(chief_slot(hosts, "host0", 1, 200_000, tmp_path / "shared")))
    # Waiting at the relay (its sender sets `_sending` before it offers: the
    # offer must have reached the relay before host1 is lost).
    hosts.pump(lambda: sender._sending is not None and hosts.relay._xfers
               and hosts.wire.empty())
    hosts.links["host1"].closed = True  # its host lost while the offer waited for a worker's save
    hosts.relay.forget("host1")
    hosts.pump(lambda: sender._sending is None)  # told: not ACK_WAIT_S later
    [told] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy)]
    assert told.error == "host host1 lost", told


def test_before_a_restart_a_host_that_lost_its_memory_gets_the_newest_save(tmp_path: Path):
    hosts = Hosts(tmp_path, ["host0", "host1"])
    shared = tmp_path / "shared"
    for seq in (1, 2):
        slot = chief_slot(hosts, "host0", seq, 200_000, shared)
        hosts.peers["host0"].memory.saved(str(slot))
        hosts.pump(lambda s=seq: len([e for e in hosts.told if isinstance(e, ev.MemoryCopy)])
                   == s and hosts.wire.empty())
    hosts.peers["host0"].memory.drain(5)
    # host0 dies before its copy of ckpt-2 reached the directory; a new agent there.
    (shared / "checkpoint").write_text('model_checkpoint_path: "ckpt-1"\n'
                                       'all_model_checkpoint_paths: "ckpt-1"\n')
    saved_before(shared / "checkpoint")
    hosts.relay.forget("host0")
    shutil.rmtree(hosts.peers["host0"].memory.root)  # swept by the next agent
    hosts.peers["host0"] = hosts.agent("host0")
    hosts.relay.prepare(["host0", "host1"], lambda: hosts.step(0.1))
    # Sent ahead of the starts: host0 expects the copy (its restore waits for it).
    root = Path(hosts.peers["host0"].memory.root)
    hosts.pump(lambda: root.is_dir() and any(n.name.startswith(".in-") for n in root.iterdir()))
    hosts.pump(lambda: any(isinstance(e, ev.MemoryCopy) and e.placed for e in hosts.told)
               and hosts.wire.empty())
    [placed] = [e for e in hosts.told if isinstance(e, ev.MemoryCopy) and e.placed]
    assert (placed.host, placed.source, placed.origin, placed.checkpoint) == (
        "host0", "host1", "host0", "ckpt-2"), placed
    found = memslots.matching(memslots.settled_roots(str(root / "worker0"), 1), "k",
                              "manager", "ckpt-2", {})
    assert found and memslots.manifest(found)["held_by"] == "host1", found
    # Published: the directory names the newest save, as every worker will read it.
    hosts.peers["host1"].memory.drain(5)
    assert 'model_checkpoint_path: "ckpt-2"' in (shared / "checkpoint").read_text()
    assert (shared / "ckpt-2.index").exists()


def test_a_restore_races_a_copy_being_placed_against_the_directory(tmp_path: Path):
    root, target, work = tmp_path / "job" / "worker0", tmp_path / "shared", tmp_path / "w"
    for folder in (root, target, work):
        folder.mkdir(parents=True)
    (target / "ckpt-2.index").write_bytes(b"from the directory")
    slot = tmp_path / "job" / "peer-host0" / "s-00000001"
    slot.mkdir(parents=True)
    (slot / "ckpt-2.index").write_bytes(b"from memory")
    # Nothing on its way: the slot found is read.
    assert nearest.fill(str(work), str(target), ["ckpt-2.index"], lambda: str(slot),
                        str(root)) == str(slot)
    assert (work / "ckpt-2.index").read_bytes() == b"from memory"
    # A copy announced that never comes: the directory, read meanwhile, wins.
    (work / "ckpt-2.index").unlink()
    (tmp_path / "job" / ".in-L1").mkdir()
    assert nearest.fill(str(work), str(target), ["ckpt-2.index"], lambda: None,
                        str(root), wait_s=30) is None
    assert (work / "ckpt-2.index").read_bytes() == b"from the directory"
    assert sorted(p.name for p in (tmp_path / "job").iterdir()) == [
        ".in-L1", "peer-host0", "worker0"]  # what it fetched aside is gone


def test_a_held_save_is_published_only_over_an_older_checkpoint(tmp_path: Path):
    manager = {"kind": "manager", "target": str(tmp_path), "pointer": "ckpt-12"}
    assert newer_than_directory(manager)  # the directory names none
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "ckpt-9"\n'
                                         'all_model_checkpoint_paths: "ckpt-9"\n')
    assert newer_than_directory(manager)
    assert not newer_than_directory({**manager, "pointer": "ckpt-9"})
    assert not newer_than_directory({**manager, "pointer": "ckpt-3"})
    keras = {"kind": "keras", "target": str(tmp_path), "pointer": '{"epoch": 3, "batch": 0}'}
    (tmp_path / "training_metadata.json").write_text('{"epoch": 2, "batch": 0}')
    assert newer_than_directory(keras)
    assert not newer_than_directory({**keras, "pointer": '{"epoch": 2, "batch": 0}'})
    assert not newer_than_directory({**keras, "pointer": "not a backup's"})
