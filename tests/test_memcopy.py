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
from pathlib import Path

from launcher.agent import memcopy
from launcher.runtime import memslots
from tests.conftest import REPO, wait_for
from tests.slowfs import mounted


def make_slot(root: Path, seq: int, name: str, size: int, keep: list[str]) -> Path:
    """A slot as the training process leaves it: a TensorFlow checkpoint's files
    and its state file (listing `keep`), then the manifest."""
    slot = root / f"s-{seq:08d}"
    slot.mkdir(parents=True)
    (slot / f"{name}.index").write_bytes(os.urandom(100))
    (slot / f"{name}.data-00000-of-00001").write_bytes(os.urandom(size))
    (slot / "checkpoint").write_text(f'model_checkpoint_path: "{name}"\n' + "".join(
        f'all_model_checkpoint_paths: "{k}"\n' for k in keep))
    memslots.seal(str(slot), {"target": str(root.parent / "unused"), "key": "k",
                              "kind": "manager", "pointer": name, "copy": True,
                              "files": memslots.ordered([p.name for p in slot.iterdir()])})
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
        names = sorted(os.listdir(target))
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
