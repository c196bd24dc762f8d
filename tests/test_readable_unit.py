"""launcher/runtime/readable.py's choice, called in this process on real
TensorFlow checkpoints, really damaged (a data file cut to half), where the
fault to meet is not a checkpoint's: a full disk while the state file is
rewritten (the write patched to fail as ENOSPC does), a save made meanwhile,
a file that a stale lookup said was missing, a worker that is not the chief.
The task processes: tests/test_readable.py.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest
import tensorflow as tf  # noqa: E402

from launcher.runtime import readable  # noqa: E402

DATA = ".data-00000-of-00001"


@pytest.fixture(autouse=True)
def _alone(monkeypatch):
    for name in ("TF_CONFIG", "MGPU_PROGRESS_FD", "MGPU_MEMORY_DIR", "MGPU_READABLE_FOLLOW_S"):
        monkeypatch.delenv(name, raising=False)
    readable._verified.clear()


def saved(tmp_path: Path, count: int, name: str = "ckpt") -> Path:
    directory = tmp_path / name
    variable = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), str(directory),
                                         max_to_keep=3)
    for i in range(count):
        variable.assign(10.0 * (i + 1))
        manager.save()
    return directory


def tear(path: Path) -> int:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return path.stat().st_size


def state(directory: Path) -> str:
    return (directory / "checkpoint").read_text()


def listed(directory: Path) -> list[str]:
    return re.findall(r'^all_model_checkpoint_paths: "([^"]+)"', state(directory), re.M)


@pytest.mark.parametrize("fails", ["open", "replace"])
def test_a_full_disk_while_the_state_is_rewritten_still_restores_the_one_that_reads(
        tmp_path, monkeypatch, capsys, fails):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    before = state(directory)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fails == "open":  # the aside file is created, then its write fails
        real_open = open

        def open_full(name, *args, **kwargs):
            if ".mgpu-" in os.fspath(name):
                real_open(name, "w").close()
                full()
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(readable, "open", open_full, raising=False)
    else:
        monkeypatch.setattr(readable.os, "replace", full)
    chosen = readable.choose(str(directory / "ckpt-4"))
    assert chosen == str(directory / "ckpt-3")
    assert not list(directory.glob("checkpoint.*")), os.listdir(directory)  # no aside left
    assert state(directory) == before  # as it was: still names ckpt-4, moved aside
    kept = list((directory / "damaged").glob("ckpt-4-*"))
    assert len(kept) == 1 and (kept[0] / f"ckpt-4{DATA}").exists()
    assert "could not be rewritten" in capsys.readouterr().err
    # The restart after: passes it over again, with no error, no aside file.
    readable._verified.clear()
    monkeypatch.undo()
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
    assert listed(directory) == ["ckpt-2", "ckpt-3"], state(directory)


def test_the_new_state_is_synced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(readable.os, "fsync", lambda fd: (calls.append("fsync"),
                                                          real_fsync(fd))[1])
    monkeypatch.setattr(readable.os, "replace", lambda a, b: (calls.append("replace"),
                                                              real_replace(a, b))[1])
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
    assert calls[:2] == ["fsync", "replace"], calls


def test_a_save_made_while_the_checkpoints_are_read_stays_listed(tmp_path, monkeypatch):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    real = readable.damage

    def a_save_meanwhile(prefix, *args, **kwargs):
        why = real(prefix, *args, **kwargs)
        if prefix.endswith("ckpt-3") and "ckpt-5" not in state(directory):
            # The chief's (or the memory tier's) ckpt-5 lands while ckpt-3 is read.
            for name in ("ckpt-3.index", f"ckpt-3{DATA}"):
                (directory / name.replace("ckpt-3", "ckpt-5")).write_bytes(
                    (directory / name).read_bytes())
            text = state(directory).replace('model_checkpoint_path: "ckpt-4"',
                                            'model_checkpoint_path: "ckpt-5"', 1)
            (directory / "checkpoint").write_text(
                text + 'all_model_checkpoint_paths: "ckpt-5"\n')
        return why

    monkeypatch.setattr(readable, "damage", a_save_meanwhile)
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
    assert listed(directory) == ["ckpt-2", "ckpt-3", "ckpt-5"], state(directory)
    assert 'model_checkpoint_path: "ckpt-5"' in state(directory)


def test_a_second_damaged_copy_of_a_name_is_kept_beside_the_first(tmp_path):
    directory = saved(tmp_path, 4)
    sizes = []
    for _ in range(2):  # ckpt-4 torn, passed over, saved again, torn again
        (directory / "checkpoint").write_text(  # a state with no save times: 'unlisted'
            'model_checkpoint_path: "ckpt-4"\n' + "".join(
                f'all_model_checkpoint_paths: "ckpt-{n}"\n' for n in (2, 3, 4)))
        sizes.append(tear(directory / f"ckpt-4{DATA}"))
        readable._verified.clear()
        assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
        variable = tf.Variable(0.0)
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), str(directory),
                                             max_to_keep=3)
        manager.checkpoint.restore(manager.latest_checkpoint)
        manager.save(checkpoint_number=4)
    kept = sorted((directory / "damaged").iterdir())
    assert len(kept) == 2, kept
    assert sorted((k / f"ckpt-4{DATA}").stat().st_size for k in kept) == sorted(sizes)


def test_a_stale_damaged_folder_does_not_redirect_a_restore_of_an_unlisted_path(
        tmp_path, monkeypatch):
    directory = saved(tmp_path, 3)
    old = directory / "damaged" / "ckpt-9-unlisted"
    old.mkdir(parents=True)
    (old / "ckpt-9.index").write_bytes(b"an earlier run's")
    (directory / "ckpt-9.index").write_bytes((directory / "ckpt-3.index").read_bytes())
    monkeypatch.setattr(readable, "RECENT_S", 0.0)  # that folder: from before
    assert readable.choose(str(directory / "ckpt-9")) == str(directory / "ckpt-9")


def test_a_data_file_that_a_stale_lookup_said_missing_is_looked_at_again(tmp_path,
                                                                          monkeypatch):
    directory = saved(tmp_path, 4)
    data = directory / f"ckpt-4{DATA}"
    hidden = directory / "hidden"
    data.rename(hidden)
    real, seen = readable.damage, []

    def stale_then_there(prefix, *args, **kwargs):
        why = real(prefix, *args, **kwargs)
        if prefix.endswith("ckpt-4") and not seen:
            seen.append(why)
            hidden.rename(data)  # the lookup was stale: it is there
        return why

    monkeypatch.setattr(readable, "damage", stale_then_there)
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-4")
    assert seen == ["its data file is missing"]
    assert not (directory / "damaged").exists() and data.exists()
    assert listed(directory) == ["ckpt-2", "ckpt-3", "ckpt-4"]


def test_a_file_missing_because_the_chief_passed_it_over_follows_the_new_state(
        tmp_path, monkeypatch):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    (directory / "damaged" / "ckpt-4-x").mkdir(parents=True)
    (directory / f"ckpt-4{DATA}").rename(directory / "damaged" / "ckpt-4-x" / f"ckpt-4{DATA}")
    new = state(directory).replace('"ckpt-4"', '"ckpt-3"', 1)
    new = "".join(line + "\n" for line in new.splitlines()
                  if line != 'all_model_checkpoint_paths: "ckpt-4"')
    real = readable._state

    def chief_rewrites(folder):
        read = real(folder)
        (directory / "checkpoint").write_text(new)  # the chief's rename, just after
        return read

    monkeypatch.setattr(readable, "_state", chief_rewrites)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
    assert state(directory) == new  # read only
    assert (directory / "ckpt-4.index").exists()  # the chief's to move


def test_a_worker_not_the_chief_moves_nothing_and_restores_the_same_one(
        tmp_path, monkeypatch, capsys):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    before = sorted(os.listdir(directory)), state(directory)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, '
                                    '"task": {"type": "worker", "index": 0}}')
    monkeypatch.setenv("MGPU_READABLE_FOLLOW_S", "0.3")  # no chief restores here
    assert readable.choose(str(directory / "ckpt-4")) == str(directory / "ckpt-3")
    assert (sorted(os.listdir(directory)), state(directory)) == before
    assert "restored read only" in capsys.readouterr().err


def test_tf_train_latest_checkpoint_reads_the_state_again_after_a_move_in_its_gap(tmp_path):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    calls = []

    def in_the_gap(checkpoint_dir, latest_filename=None):
        calls.append(checkpoint_dir)
        if len(calls) == 1:  # it read the old state; the chief passes ckpt-4 over...
            readable.choose(str(directory / "ckpt-4"))
            return None  # ...and ckpt-4's index is gone when it looks for it
        return tf.train.latest_checkpoint(checkpoint_dir, latest_filename)

    latest = readable._latest(in_the_gap)
    assert latest(str(directory)) == str(directory / "ckpt-3")
    assert tf.train.latest_checkpoint(str(tmp_path / "none")) is None
    assert readable._latest(tf.train.latest_checkpoint)(str(tmp_path / "none")) is None


def test_a_copy_that_died_after_its_commit_is_rolled_forward_with_the_tier_off(tmp_path):
    """An earlier run's memory-tier copy died after its journal (agent/publish.py):
    the next run, the tier off, still reads that save whole, not its data with
    the old state file: the manager's directory is rolled forward first."""
    directory = saved(tmp_path, 2)  # ckpt-1, ckpt-2
    newer = saved(tmp_path, 3, name="newer")  # the copy's save: ckpt-3 and its state
    for suffix in (DATA, ".index"):
        (directory / f"ckpt-3{suffix}").write_bytes((newer / f"ckpt-3{suffix}").read_bytes())
    (directory / ".checkpoint.mgpu-part").write_text(state(newer).replace(str(newer),
                                                                           str(directory)))
    (directory / ".mgpu-publish").write_text('["checkpoint"]')  # placed up to the state
    readable._manager_init(lambda *args, **kwargs: None)(None, None, str(directory))  # hooked
    variable = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variable), str(directory),
                                         max_to_keep=3)
    manager.checkpoint.restore(manager.latest_checkpoint)
    assert manager.latest_checkpoint.endswith("ckpt-3") and variable.numpy() == 30.0
    assert not (directory / ".mgpu-publish").exists()
