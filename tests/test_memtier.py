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
