"""The memory tier in a real TensorFlow process (launcher/runtime/memtier.py):
off, nothing is hooked; a memory folder that fills up sends the saves to
their directory, said once, and nothing is lost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import cli_env

SCRIPT = """
import os, sys
import tensorflow as tf
print("HOOKED", "_mgpu_memory_tier" in dir(tf.train.CheckpointManager.__init__))
v = tf.Variable(tf.zeros([700, 1000]))  # 2.8 MB a save: more than the 1 MB folder holds
manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), sys.argv[1], max_to_keep=2)
for _ in range(3):
    v.assign_add(tf.ones_like(v))
    manager.save()
restored = tf.Variable(tf.zeros([700, 1000]))
tf.train.Checkpoint(v=restored).restore(tf.train.latest_checkpoint(sys.argv[1]))
print("RESTORED", float(restored[0, 0]))
"""


def run(tmp_path: Path, memory_dir: str | None, ckpt: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = cli_env()
    env.pop("MGPU_MEMORY_DIR", None)
    if memory_dir:
        env["MGPU_MEMORY_DIR"] = memory_dir
    return subprocess.run([sys.executable, "-m", "launcher.bootstrap", str(script),
                           str(tmp_path / ckpt)], env=env, capture_output=True, text=True,
                          timeout=120)


def test_off_hooks_nothing_and_a_full_memory_folder_saves_to_the_directory(tmp_path: Path):
    off = run(tmp_path, None, "off")
    assert off.returncode == 0 and "HOOKED False" in off.stdout, off.stderr[-2000:]

    small = tmp_path / "shm"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(small)],
                   check=True)
    try:
        os.mkdir(small / "worker0", 0o700)
        full = run(tmp_path, str(small / "worker0"), "full")
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "HOOKED True" in full.stdout
    assert full.stderr.count("memory tier full") == 1, full.stderr[-3000:]
    assert "RESTORED 3.0" in full.stdout  # every save is in the directory
    assert (tmp_path / "full" / "checkpoint").exists()


def test_a_workers_scratch_folder_stands_for_the_folder_its_restore_reads(monkeypatch):
    from launcher.runtime import memslots, memtier

    # tf_keras' BackupAndRestore: the read manager on DIR/chief, built first.
    monkeypatch.setattr(memtier, "_built", ["/c/chief", "/c/other"])
    assert memtier._stands_for("/c/workertemp_1") == "/c/chief"
    assert memslots.key_of("/c/chief") != memslots.key_of("/c/workertemp_1")
    # TF's custom-loop tutorial: the read manager on DIR itself.
    monkeypatch.setattr(memtier, "_built", ["/c", "/c/best"])  # and another of its own
    assert memtier._stands_for("/c/workertemp_1") == "/c"
    monkeypatch.setattr(memtier, "_built", [])  # no reader built here: the parent
    assert memtier._stands_for("/c/workertemp_1") == "/c"
    assert memtier._stands_for("/c/chief") == "/c/chief"  # a folder of its own


TUTORIAL = """
import json, os, sys
import tensorflow as tf
from launcher.agent import memcopy
from launcher.runtime import memslots

memory = os.environ["MGPU_MEMORY_DIR"]
agent = memcopy.MemoryCopies(sys.argv[1], "host0", print)  # this host's agent, in-process
agent.root = os.path.dirname(memory)
v = tf.Variable(0.0)


def as_task(index):
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                          "task": {"type": "worker", "index": index}})


# TF's custom-loop tutorial on worker 1: a scratch folder, removed after each save.
as_task(1)
write_dir = os.path.join(sys.argv[1], "scratch", "workertemp_1")
tf.io.gfile.makedirs(write_dir)
scratch = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), write_dir, max_to_keep=1)
for _ in range(3):
    scratch.save()
    tf.io.gfile.rmtree(write_dir)
print("SCRATCH REMOVED", not os.path.exists(write_dir), flush=True)
# The chief's manager keeps every save (max_to_keep=None).
as_task(0)
directory = os.path.join(sys.argv[1], "all")
manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), directory, max_to_keep=None)
for _ in range(5):
    v.assign_add(1.0)
    manager.save()
    agent.saved(memslots.slots(memory)[-1][1])
    assert agent.drain(60)
work = memslots.working(memory, directory)
print("LISTED", len(manager.checkpoints), "IN MEMORY",
      len({n.partition(".")[0] for n in os.listdir(work) if n.startswith("ckpt-")}), flush=True)
"""


def test_a_worker_removes_its_scratch_folder_and_the_directory_keeps_every_save(tmp_path: Path):
    script = tmp_path / "tutorial.py"
    script.write_text(TUTORIAL)
    memory = tmp_path / "shm" / "job" / "worker0"
    memory.mkdir(parents=True, mode=0o700)
    env = cli_env() | {"MGPU_MEMORY_DIR": str(memory), "MGPU_MEMORY_COPIES": "2"}
    done = subprocess.run([sys.executable, "-m", "launcher.bootstrap", str(script),
                           str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                          timeout=120)
    # The tutorial's `tf.io.gfile.rmtree` finds the folder it saved to.
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SCRATCH REMOVED True" in done.stdout, done.stdout[-2000:]
    # What the script asked for: every save, listed and in its directory; memory bounded.
    assert "LISTED 5 IN MEMORY 2" in done.stdout, done.stdout[-2000:]
    state = (tmp_path / "ckpt" / "all" / "checkpoint").read_text()
    assert [f"ckpt-{n}" in state for n in range(1, 6)] == [True] * 5, state
    for n in range(1, 6):
        assert (tmp_path / "ckpt" / "all" / f"ckpt-{n}.index").exists(), n


def test_a_workers_scratch_folder_shows_the_files_its_manager_keeps(tmp_path: Path):
    from launcher.runtime import memslots

    work, scratch = tmp_path / "w", tmp_path / "ckpt" / "workertemp_1"
    work.mkdir()
    for name in ("checkpoint", "ckpt-1.index", "ckpt-1.data-00000-of-00001"):
        (work / name).write_text(name)
    memslots.mirror(str(work), str(scratch))
    assert sorted(os.listdir(scratch)) == ["checkpoint", "ckpt-1.data-00000-of-00001",
                                           "ckpt-1.index"]
    assert (scratch / "ckpt-1.index").read_text() == "ckpt-1.index"
    # The next save: the manager deleted ckpt-1; the script's own file is kept.
    for name in ("ckpt-1.index", "ckpt-1.data-00000-of-00001"):
        (work / name).unlink()
    (work / "ckpt-2.index").write_text("2")
    (scratch / "notes.txt").write_text("mine")
    memslots.mirror(str(work), str(scratch))
    assert sorted(os.listdir(scratch)) == ["checkpoint", "ckpt-2.index", "notes.txt"]
    # The program's end: its links go (they would dangle once memory is cleared).
    memslots.unmirror()
    assert os.listdir(scratch) == ["notes.txt"]
    # A crash's links, dangling in the next generation: the next save there drops them.
    os.symlink(str(tmp_path / "gone" / "ckpt-9.index"), scratch / "ckpt-9.index")
    memslots.mirror(str(work), str(scratch))
    assert sorted(os.listdir(scratch)) == ["checkpoint", "ckpt-2.index", "notes.txt"]
