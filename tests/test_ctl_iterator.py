"""A custom loop with its input's iterator in its checkpoint trains every
sample of every epoch once across a resume in the middle of an epoch
(launcher/runtime/ownposition.py): each worker continues from its own
position, not from the chief's that every worker restores. Counted as
tests/test_exact_epochs.py counts: from the ids each step saw, each step's
last generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.runtime import ownposition
from tests.conftest import SCRIPTS, read_summary
from tests.test_exact_epochs import trained_per_epoch, twice_and_never
from tests.test_faults import Job, jobs, launch  # noqa: F401 - `jobs` is a fixture

SCRIPT = str(SCRIPTS / "ctl_iterator.py")
OWN = "this worker's input continues from its own position at ckpt-4"
MEMORY_CLUSTER = ("name: two\ntransport: local\nrestart: {backoff_s: 0}\n"
                  "checkpoint: {memory: true}\nhosts:\n" + "  - {address: 127.0.0.1}\n" * 2)


@pytest.mark.e2e
def test_a_custom_loop_resumed_mid_epoch_with_its_iterator_restored_trains_each_sample_once(
        workdir, jobs, monkeypatch):  # noqa: F811
    """TF's custom-loop tutorial shape (tests/scripts/ctl_iterator.py): two
    workers, each its own shard of a seeded reshuffled stream, the iterator in
    the checkpoint saved every 3 steps by its CheckpointManager or by
    `Checkpoint.save`, or (memory tier on) by every worker's manager on the
    directory and restored by `manager.latest_checkpoint` (a path in the
    tier's working folder), worker 1 killed after step 14 (epoch 1 of 8-step
    epochs). The restart resumes at step 12 and each epoch trains its 64
    samples once. Before: worker 1 restored the chief's iterator and read the
    chief's shard: 5 samples twice and 5 never."""
    monkeypatch.setenv("KILL_AT_STEP", "14")
    started: dict[str, tuple[Job, Path]] = {}
    for save_with in ("manager", "checkpoint", "shared"):  # side by side
        folder = workdir / save_with
        (folder / "ids").mkdir(parents=True)
        monkeypatch.setenv("SAVE_WITH", save_with)  # read as each job starts
        cluster = ["--local", "2"]
        if save_with == "shared":  # the memory tier: restored from its working folder
            (folder / "two.yaml").write_text(MEMORY_CLUSTER)
            cluster = [str(folder / "two.yaml")]
        started[save_with] = (launch(jobs, [*cluster, "--max-restarts", "1", "--no-live",
                                            SCRIPT, str(folder / "ckpt"), str(folder / "ids")],
                                     folder), folder)
    for save_with, (job, folder) in started.items():
        assert job.finish(timeout=240) == 0, (save_with, job.output[-3000:])
        summary = read_summary(job.run_dir)
        assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
        assert summary["resumed"][0]["step"] == 12, (save_with, summary["resumed"])
        epochs = trained_per_epoch(folder / "ids")
        assert twice_and_never(epochs) == (0, 0), (save_with,
                                                   [sorted(e.items()) for e in epochs])
        assert all(set(epoch) == set(range(64)) for epoch in epochs), save_with
        assert f"host1/worker1 | mgpu-launch: {OWN}" in job.output, job.output[-3000:]
        copies = sorted(p.name for p in (folder / "ckpt" / ownposition.FOLDER /
                                         "2w-worker-1").iterdir())
        assert copies and all(name.startswith("ckpt-") for name in copies), copies


def _probe(tmp_path: Path, code: str, index: int) -> str:
    """`code` in a fresh process as worker `index` of two (its output)."""
    env = {**os.environ, "TF_CONFIG": json.dumps({
        "cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
        "task": {"type": "worker", "index": index}}), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, cwd=str(tmp_path), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


PROBE = """
import os, tensorflow as tf
from launcher.runtime import ownposition
ownposition.on_tensorflow(tf)
it = iter(tf.data.Dataset.range(100).shard(2, {index}))
ckpt = tf.train.Checkpoint(iterator=it)
{body}
"""


def test_a_worker_keeps_its_own_position_bounded_and_says_when_it_has_none(tmp_path):
    """Worker 1 saves 12 times with no state file beside (a `Checkpoint.save`
    into a scratch folder): its copies are the newest 8, in the chief's
    directory; a restore of the chief's save 12 reads its own position over
    the chief's (its iterator's next element is its own); a restore of save 2
    (its copy swept) says it continues from the chief's position and removes
    the later copies. The chief keeps no copy."""
    save = """
for n in range(12):
    next(it)
    ckpt.save(os.path.join("ckpt", "workertemp_1", "ckpt"))
"""
    _probe(tmp_path, PROBE.format(index=1, body=save), 1)
    folder = tmp_path / "ckpt" / ownposition.FOLDER / "2w-worker-1"
    assert sorted(int(p.name.split("-")[1].split(".")[0]) for p in folder.glob("*.index")) == \
        list(range(5, 13))
    restore = """
chief = iter(tf.data.Dataset.range(100).shard(2, 0))
for _ in range(3):
    next(chief)
tf.train.Checkpoint(iterator=chief).write(os.path.join("ckpt", "ckpt-12"))  # the chief's
ckpt.read(os.path.join("ckpt", "ckpt-12"))
print("NEXT", int(next(it)))
ckpt.read(os.path.join("ckpt", "workertemp_1", "ckpt-2"))
"""
    said = _probe(tmp_path, PROBE.format(index=1, body=restore), 1)
    # Its own 13th element (1, 3, ..., 23 read), not the chief's 4th (6) nor a 4th of its own.
    assert "NEXT 25" in said and OWN.replace("ckpt-4", "ckpt-12") in said, said
    assert "ckpt-2 holds the chief's input position" in said, said
    # Back at save 2, the copies of later saves are of a run gone back from: removed (a
    # number is used again after such a restore, maybe at another step).
    assert not list(folder.glob("*.index")), sorted(p.name for p in folder.iterdir())
    chief = _probe(tmp_path, PROBE.format(index=0, body=save.replace("workertemp_1", "c0")), 0)
    assert not (tmp_path / "ckpt" / ownposition.FOLDER / "2w-worker-0").exists(), chief


def test_two_savers_of_one_directory_keep_their_own_copies(tmp_path):
    """Worker 1's manager of `ckpt` saves (the iterator in them) and a second
    manager of `model` saves (the model only) in the same directory, taking
    turns: the state file names the other saver's each time, and no copy of
    `ckpt` is swept for it (before: every copy, the state file's names taken
    for its own); a restore of `ckpt-3` reads its own copy."""
    body = """
model = tf.Variable([[1.0]])
ckpts = tf.train.CheckpointManager(ckpt, "d", max_to_keep=2)
models = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), "d", max_to_keep=2,
                                    checkpoint_name="model")
for n in range(4):
    next(it)
    ckpts.save()
    models.save(checkpoint_number=1000 * (n + 1))
for _ in range(5):
    next(it)
ckpt.read(os.path.join("d", "ckpt-3"))
print("NEXT", int(next(it)))
"""
    said = _probe(tmp_path, PROBE.format(index=1, body=body), 1)
    folder = tmp_path / "d" / ownposition.FOLDER / "2w-worker-1"
    # None swept for the other saver's names; ckpt-4's removed by the restore of ckpt-3.
    assert sorted(p.name for p in folder.glob("*.index")) == [
        "ckpt-1.index", "ckpt-2.index", "ckpt-3.index"], said
    assert "NEXT 7" in said and OWN.replace("ckpt-4", "ckpt-3") in said, said  # 1, 3, 5 read


def test_a_torn_newest_checkpoint_holding_an_iterator_is_passed_over(tmp_path):
    """An iterator's state is a variant tensor, which has no numpy value: the
    restore's check (runtime/readable.py) reads its bytes another way, so a
    torn newest save holding one is passed over for the one before, as any
    other (before: "cannot be told", and the restore failed on the torn file)."""
    body = """
from launcher.runtime import readable
readable.on_tensorflow(tf)
manager = tf.train.CheckpointManager(ckpt, "d", max_to_keep=3)
for n in range(3):
    next(it)
    manager.save()
data = os.path.join("d", "ckpt-3.data-00000-of-00001")
os.truncate(data, os.path.getsize(data) // 2)
ckpt.read(tf.train.latest_checkpoint("d"))
print("NEXT", int(next(it)))
"""
    said = _probe(tmp_path, PROBE.format(index=0, body=body), 0)  # the chief: it mends
    assert "NEXT 4" in said and "cannot be read" in said, said  # ckpt-2's: 0, 2 read


def test_a_manager_numbered_by_a_step_variable_and_an_interval_keeps_a_copy_per_save_made(
        tmp_path):
    """`manager.save(checkpoint_number=step)` with a step variable made under a
    strategy (read as the manager reads it; `int()` of it failed, and no copy
    was kept), every step, the manager's `checkpoint_interval` taking one in
    10: a copy for each save the manager makes (before: one per call, 40),
    and a file of another name that merely starts alike is not a copy."""
    body = """
with tf.distribute.MirroredStrategy().scope():
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
manager = tf.train.CheckpointManager(ckpt, "d", max_to_keep=3, step_counter=step,
                                     checkpoint_interval=10)
os.makedirs(os.path.join("d", ".mgpu-positions", "2w-worker-1"))
open(os.path.join("d", ".mgpu-positions", "2w-worker-1", "ckpt-5_best-2.index"), "w").close()
for n in range(40):
    step.assign_add(1)
    next(it)
    manager.save(checkpoint_number=step)
print("SAVES", sorted(int(p.rsplit("-", 1)[1]) for p in manager.checkpoints))
"""
    said = _probe(tmp_path, PROBE.format(index=1, body=body), 1)
    assert "SAVES [11, 21, 31]" in said, said
    folder = tmp_path / "d" / ownposition.FOLDER / "2w-worker-1"
    assert sorted(p.name for p in folder.iterdir()) == [
        *(f"ckpt-{n}{ext}" for n in (1, 11, 21, 31)
          for ext in (".data-00000-of-00001", ".index")), "ckpt-5_best-2.index"], said
