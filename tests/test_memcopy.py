"""The memory tier's copies and folders (launcher/agent/memcopy.py,
launcher/runtime/memslots.py): a copy killed in the middle, against a real
throttled mount, leaves the previous complete checkpoint; folders are private,
bounded and removed."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from launcher.agent import memcopy
from launcher.runtime import memslots
from tests.conftest import REPO, wait_for
from tests.slowfs import mounted


def saved_names(target: Path) -> list[str]:
    """The directory's files a script sees (the launcher's own are dot files)."""
    return sorted(n for n in os.listdir(target) if not n.startswith("."))


def make_slot(root: Path, seq: int, name: str, size: int, keep: list[str],
              saved: float | None = None) -> Path:
    """A slot as the training process leaves it: a TensorFlow checkpoint's files
    and its state file (listing `keep`), then the manifest (`saved`: its time)."""
    slot = root / f"s-{seq:08d}"
    slot.mkdir(parents=True)
    (slot / f"{name}.index").write_bytes(os.urandom(100))
    (slot / f"{name}.data-00000-of-00001").write_bytes(os.urandom(size))
    (slot / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\n' + "".join(
        f'all_model_checkpoint_paths: "{k}"\n' for k in keep))
    memslots.seal(str(slot), {"target": str(root.parent / "unused"), "key": "k",
                              "kind": "manager", "pointer": name, "copy": True,
                              "files": memslots.ordered([p.name for p in slot.iterdir()])}
                  | ({} if saved is None else {"time": saved}))
    return slot


def part_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if "mgpu-part" in p.name)


def test_a_copy_killed_in_the_middle_leaves_the_previous_complete_checkpoint(tmp_path: Path):
    memory = tmp_path / "memory" / "worker0"
    first = make_slot(memory, 1, "ckpt-1", 1_000_000, ["ckpt-1"])
    second = make_slot(memory, 2, "ckpt-2", 30_000_000, ["ckpt-2"])
    with mounted(str(tmp_path / "backing"), str(tmp_path / "shared"), 20) as shared:
        target = Path(shared) / "ckpt"
        record = memslots.manifest(str(first)) | {"target": str(target)}
        memcopy.copy_slot(str(first), record, {})
        before = (target / "ckpt-1.data-00000-of-00001").read_bytes()
        code = ("import sys; from launcher.agent import memcopy; from launcher.runtime import "
                "memslots; r = memslots.manifest(sys.argv[1]) | {'target': sys.argv[2]}; "
                "memcopy.copy_slot(sys.argv[1], r, {})")
        copier = subprocess.Popen([sys.executable, "-c", code, str(second), str(target)],
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            wait_for(lambda: part_size(target) > 5_000_000, timeout=20,
                     what="the copy of ckpt-2 under way (5 of its 30 MB written)")
        finally:
            copier.send_signal(signal.SIGKILL)
            copier.wait()
        # What a restore reads: the state file names ckpt-1, whole; no ckpt-2 by its name.
        assert 'model_checkpoint_path: "ckpt-1"' in (target / "checkpoint").read_text()
        assert (target / "ckpt-1.data-00000-of-00001").read_bytes() == before
        assert "ckpt-2.data-00000-of-00001" not in os.listdir(target)
        # The next copy sweeps what the dead one left, then completes.
        memcopy.copy_slot(str(second), memslots.manifest(str(second)) | {"target": str(target)},
                          {})
        names = saved_names(target)
        assert names == ["checkpoint", "ckpt-2.data-00000-of-00001", "ckpt-2.index"], names


def test_memory_folders_are_private_bounded_and_removed(tmp_path: Path):
    shm = tmp_path / "shm"
    shm.mkdir()
    copies = memcopy.MemoryCopies(str(tmp_path / "run"), "host0", print, shm=str(shm))
    env: dict[str, str] = {}
    copies.task_env("worker0", env)
    assert env == {} and not list(shm.iterdir())  # off: nothing made
    env = {"MGPU_MEMORY_COPIES": "2"}
    copies.task_env("worker0", env)
    folder = Path(env["MGPU_MEMORY_DIR"])
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    assert folder.stat().st_uid == os.getuid()
    for seq in range(1, 5):
        make_slot(folder, seq, f"ckpt-{seq}", 10, [f"ckpt-{seq}"])
    memslots.prune(str(folder), 2)
    assert [s for s, _ in memslots.slots(str(folder))] == [3, 4]
    assert stat.S_IMODE((folder / "s-00000004" / "checkpoint").stat().st_mode) == 0o600
    # tf_keras' and the tutorials' per-worker scratch folder shares the chief's key.
    assert memslots.key_of("/ckpt/workertemp_1/chief") == memslots.key_of("/ckpt/chief")
    copies.close(timeout_s=1)
    assert not list(shm.iterdir())


def test_the_next_agent_removes_the_folders_of_dead_agents_only(tmp_path: Path):
    shm = tmp_path / "shm"
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                             "launcher.agent"])
    try:
        wait_for(lambda: b"launcher.agent" in Path(f"/proc/{live.pid}/cmdline").read_bytes(),
                 timeout=10, what="the stand-in agent's start")
        for name, pid in (("dead", 999_999_999), ("live", live.pid)):
            folder = shm / f"{memcopy.PREFIX}{os.getuid()}-{name}"
            folder.mkdir(parents=True)
            (folder / memcopy.OWNER).write_text(str(pid))
        assert memcopy.sweep(str(shm)) == [f"{memcopy.PREFIX}{os.getuid()}-dead"]
        assert [p.name for p in shm.iterdir()] == [f"{memcopy.PREFIX}{os.getuid()}-live"]
    finally:
        live.kill()
        live.wait()


def test_a_directory_is_marked_while_its_copy_is_under_way_and_a_restore_waits_for_it(
        tmp_path: Path):
    shm = tmp_path / "shm"
    shm.mkdir()
    copies = memcopy.MemoryCopies(str(tmp_path / "run"), "host0", print, shm=str(shm))
    told: list[tuple] = []
    copies.report = lambda *args: told.append(args)
    env = {"MGPU_MEMORY_COPIES": "2"}
    copies.task_env("worker0", env)
    with mounted(str(tmp_path / "backing"), str(tmp_path / "shared"), 20) as shared:
        target = Path(shared) / "ckpt"
        slot = make_slot(Path(env["MGPU_MEMORY_DIR"]), 1, "ckpt-1", 8_000_000, ["ckpt-1"])
        record = memslots.manifest(str(slot)) | {"target": str(target)}
        memslots.seal(str(slot), record)
        copies.saved(str(slot), "worker0", 3)
        # Marked before saved() returned: a restarted task's restore waits, then
        # reads the newest checkpoint, whole (8 MB at 20 MB/s: ~0.4 s).
        assert (target / memcopy.COPYING).exists()
        waited = memslots.wait_for_copy(str(target))
        assert waited > 0.1, waited
        assert 'model_checkpoint_path: "ckpt-1"' in (target / "checkpoint").read_text()
        assert not (target / memcopy.COPYING).exists()
        copies.close(timeout_s=30)
    [(task, generation, data)] = told  # the copy's cost, as the task's progress (the drill)
    assert (task, generation) == ("worker0", 3) and data["memory_copy_bytes"] > 8_000_000
    assert data["memory_copy_s"] > 0.1, data
    # A marker nobody refreshes (its agent died) is waited for a bounded while only.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / memcopy.COPYING).write_text("")
    assert memslots.wait_for_copy(str(stale), stale_s=0.3) < 2.0


def keras_slot(root: Path, seq: int, epoch: int, saved: float) -> Path:
    """A Keras 3 BackupAndRestore save's slot."""
    slot = root / f"s-{seq:08d}"
    slot.mkdir(parents=True)
    (slot / "latest.weights.h5").write_bytes(os.urandom(1000))
    (slot / "training_metadata.json").write_text(f'{{"epoch": {epoch}, "batch": -1}}')
    memslots.seal(str(slot), {"target": "unused", "key": "k", "kind": "keras", "copy": True,
                              "pointer": (slot / "training_metadata.json").read_text(),
                              "files": memslots.ordered([p.name for p in slot.iterdir()]),
                              "time": saved})
    return slot


def test_a_late_copy_never_rolls_the_directory_back(tmp_path: Path):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "ckpt"
    now = time.time()
    first = make_slot(memory, 1, "ckpt-3", 1000, ["ckpt-3"], saved=now - 300)
    reused = make_slot(memory, 2, "ckpt-4", 1000, ["ckpt-3", "ckpt-4"], saved=now - 200)
    newest = make_slot(memory, 3, "ckpt-4", 2000, ["ckpt-4"], saved=now - 100)

    def copy(slot: Path) -> bool:
        return memcopy.copy_slot(str(slot), memslots.manifest(str(slot)) | {"target": str(target)},
                                 {})

    copy(newest)  # the next generation's save (restored ckpt-3: TF names it ckpt-4 again)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    # An agent given up on drains its queue: its older saves, the same name or an older one.
    late = [copy(reused), copy(first)]
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    assert late == [False, False]
    assert 'model_checkpoint_path: "ckpt-4"' in (target / "checkpoint").read_text()
    # A save the script wrote itself (memory full: to its directory) is newer than a
    # copy of a save made before it.
    (target / "checkpoint").write_text('model_checkpoint_path: "ckpt-4"\n')
    assert not copy(make_slot(memory, 4, "ckpt-5", 10, ["ckpt-5"], saved=now - 50))
    # A newer save is copied, and the state's rule drops what it no longer lists.
    assert copy(make_slot(memory, 5, "ckpt-6", 10, ["ckpt-6"], saved=time.time() + 1))
    assert saved_names(target) == ["checkpoint", "ckpt-6.data-00000-of-00001", "ckpt-6.index"]
    # Keras' backup: its metadata names the save.
    backup = tmp_path / "backup"
    keras_new, keras_old = keras_slot(memory, 6, 5, now - 10), keras_slot(memory, 7, 3, now - 20)
    for slot, copied in ((keras_new, True), (keras_old, False)):
        record = memslots.manifest(str(slot)) | {"target": str(backup)}
        assert memcopy.copy_slot(str(slot), record, {}) is copied
    assert '"epoch": 5' in (backup / "training_metadata.json").read_text()
    assert (backup / "latest.weights.h5").read_bytes() == (
        keras_new / "latest.weights.h5").read_bytes()


def test_hosts_whose_clocks_disagree_order_their_saves_by_generation_and_step(tmp_path: Path):
    """A worker's host 300 s ahead of the chief's: its saves' times are later
    than newer saves of the chief's. By time alone the chief's next save was
    refused as older (lost to the directory); by run, generation, the saving
    process's count of saves and step it is not."""
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "ckpt"
    now, seq = time.time(), iter(range(1, 100))

    def copy(name: str, generation: int, step: int | None, saved: float,
             process: str = "host0:10", run: str = "r1") -> bool:
        number = next(seq)
        slot = make_slot(memory, number, name, 10, [name], saved=saved)
        record = memslots.manifest(str(slot)) | {
            "target": str(target), "step": step, "generation": generation, "run": run,
            "process": process, "seq": number}
        return memcopy.copy_slot(str(slot), record, {})

    def names_save() -> str:
        return (target / "checkpoint").read_text().split('"')[1]

    assert copy("ckpt-1", 1, 10, now + 300, "host1:20")  # relayed from the fast host
    assert copy("ckpt-2", 1, 20, now) and names_save() == "ckpt-2"  # the chief's, later
    assert copy("ckpt-1", 2, 10, now - 200) and names_save() == "ckpt-1"  # restarted: rolled back
    # A late copy of generation 1, whatever its step and its host's clock, is older.
    assert not copy("ckpt-3", 1, 30, now + 600) and names_save() == "ckpt-1"
    # One process's later save, its step counted from 0 again (a second fit): later.
    assert copy("ckpt-2", 2, 3, now - 190) and names_save() == "ckpt-2"
    assert copy("ckpt-4", 2, None, now - 100, "host1:21")  # another process, no step: by time
    assert not copy("ckpt-9", 2, None, now - 150, "host1:22") and names_save() == "ckpt-4"
    # The next run into the directory: its generations count from 0 again; the
    # previous run's order tells nothing, the files' time does.
    assert copy("ckpt-5", 0, 100, now - 90, run="r2") and names_save() == "ckpt-5"
    # The script saved there itself since (memory full): its files' time decides again.
    (target / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    assert not copy("ckpt-8", 0, 180, now - 50, run="r2") and names_save() == "ckpt-7"
    assert saved_names(target) == ["checkpoint", "ckpt-5.data-00000-of-00001", "ckpt-5.index"]


def test_the_copier_says_a_late_copy_and_the_tasks_end_does_not_wait_for_it(tmp_path: Path):
    shm = tmp_path / "shm"
    shm.mkdir()
    said: list[str] = []
    copies = memcopy.MemoryCopies(str(tmp_path / "run"), "host0", said.append, shm=str(shm))
    told: list[tuple] = []
    copies.report = lambda *args: told.append(args)
    env = {"MGPU_MEMORY_COPIES": "2"}
    copies.task_env("worker0", env)
    target = tmp_path / "ckpt"
    target.mkdir()
    (target / "checkpoint").write_text('model_checkpoint_path: "ckpt-9"\n')  # written now
    late = make_slot(Path(env["MGPU_MEMORY_DIR"]), 1, "ckpt-8", 10, ["ckpt-8"],
                     saved=time.time() - 60)
    memslots.seal(str(late), memslots.manifest(str(late)) | {"target": str(target)})
    copies.copy_later(str(target), str(late), owner=("worker0", 1))
    assert copies.drain(timeout_s=30)
    assert (late / memcopy.COPIED).exists()  # the task's end does not wait for it
    assert 'model_checkpoint_path: "ckpt-9"' in (target / "checkpoint").read_text()
    assert not told and any("holds a newer save" in line for line in said), said
    copies.close(timeout_s=5)


def test_a_manager_keeping_more_than_memory_lists_only_whole_checkpoints(tmp_path: Path):
    """max_to_keep=None, memory_copies=2: the slot's state lists every save, the
    slot holds the newest two; a save superseded before its copy is not listed."""
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "ckpt"
    slot = make_slot(memory, 4, "ckpt-4", 10, ["ckpt-1", "ckpt-2", "ckpt-3", "ckpt-4"],
                     saved=time.time())
    (slot / "ckpt-3.index").write_bytes(b"kept in memory")
    record = memslots.manifest(str(slot)) | {"target": str(target)}
    record["files"] = memslots.ordered([*record["files"], "ckpt-3.index"])
    target.mkdir()
    (target / "ckpt-1.index").write_bytes(b"copied before")
    assert memcopy.copy_slot(str(slot), record, {})
    state = (target / "checkpoint").read_text()
    assert [f'"ckpt-{n}"' in state for n in range(1, 5)] == [True, False, True, True], state
    assert (target / "ckpt-1.index").exists()


def test_two_savers_of_one_directory_keep_their_saves(tmp_path: Path):
    """A backup and a manager saving into one directory: a save of one never
    supersedes the other's copy still waiting (the same saver's newer one does)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    copies = memcopy.MemoryCopies(str(tmp_path / "run"), "host0", print, shm=str(shm))
    env = {"MGPU_MEMORY_COPIES": "4"}
    copies.task_env("worker0", env)
    memory, target = Path(env["MGPU_MEMORY_DIR"]), tmp_path / "ckpt"
    now = time.time()
    backup = keras_slot(memory, 1, 2, now - 3)
    older = make_slot(memory, 2, "ckpt-1", 10, ["ckpt-1"], saved=now - 2)
    manager = make_slot(memory, 3, "ckpt-2", 10, ["ckpt-2"], saved=now - 1)
    for slot in (backup, older, manager):
        memslots.seal(str(slot), memslots.manifest(str(slot)) | {"target": str(target)})
    with copies._cond:  # all three queued before the copier takes one
        for slot in (backup, older, manager):
            copies.copy_later(str(target), str(slot))
    assert copies.drain(timeout_s=30)
    assert '"epoch": 2' in (target / "training_metadata.json").read_text()
    assert 'model_checkpoint_path: "ckpt-2"' in (target / "checkpoint").read_text()
    assert not (older / memcopy.COPIED).exists()  # superseded by the manager's newer save
    copies.close(timeout_s=5)


def test_each_saver_of_a_directory_has_a_working_folder_of_its_own(tmp_path: Path):
    """A Keras save empties its working folder before it writes: never a
    manager's (its checkpoints and state), nor another callback's."""
    folders = {memslots.working(str(tmp_path), "/ckpt", saver) for saver in ("", "backup",
                                                                            "model")}
    assert len(folders) == 3 and all(os.path.isdir(f) for f in folders)
    assert memslots.working(str(tmp_path), "/ckpt/workertemp_1") in folders  # the chief's


def test_a_copy_that_fails_is_said_to_the_user_once(tmp_path: Path):
    # The directory cannot be written (here: a file where its parent folder
    # should be; on a cluster: a full or read-only shared filesystem). The user
    # hears once that the newer saves are in memory only, not just the agent's log.
    shm = tmp_path / "shm"
    shm.mkdir()
    logged: list[str] = []
    said: list[str] = []
    copies = memcopy.MemoryCopies(str(tmp_path / "run"), "host0", logged.append,
                                  shm=str(shm), notice=said.append)
    env = {"MGPU_MEMORY_COPIES": "2"}
    copies.task_env("worker0", env)
    (tmp_path / "not-a-folder").write_text("")
    target = tmp_path / "not-a-folder" / "ckpt"
    for seq in (1, 2):
        slot = make_slot(Path(env["MGPU_MEMORY_DIR"]), seq, f"ckpt-{seq}", 10, [f"ckpt-{seq}"])
        memslots.seal(str(slot), memslots.manifest(str(slot)) | {"target": str(target)})
        copies.copy_later(str(target), str(slot), owner=("worker0", 1))
        assert copies.drain(timeout_s=30)
    failed = [line for line in said if "failed" in line]
    assert len(failed) == 1 and str(target) in failed[0] and "memory only" in failed[0], said
    assert sum("failed" in line for line in logged) == 2, logged  # each in the agent's log
    copies.close(timeout_s=5)
