"""A copy's files published at once, as a restore sees them
(launcher/agent/publish.py, runtime/memslots.py finish_publish): a Keras 3
backup's copy killed between its weights' rename and its metadata's never
leaves new weights with old metadata (issue 55)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launcher.agent import memcopy, publish
from launcher.runtime import memslots
from tests.test_memcopy import keras_slot, make_slot, saved_names


class Killed(BaseException):
    """The agent killed (-9) at this point of its copy."""


def copy(slot: Path, target: Path) -> bool:
    return memcopy.copy_slot(str(slot), memslots.manifest(str(slot)) | {"target": str(target)}, {})


def backup(target: Path) -> tuple[bytes, dict]:
    return ((target / "latest.weights.h5").read_bytes(),
            json.loads((target / "training_metadata.json").read_text()))


def kill_after(monkeypatch: pytest.MonkeyPatch, calls: int, what: str = "place") -> None:
    """The copy dies after `calls` calls of publish's `what`."""
    real, seen = getattr(publish, what), {"n": 0}

    def dying(*args, **kwargs):
        if seen["n"] >= calls:
            raise Killed
        seen["n"] += 1
        return real(*args, **kwargs)
    monkeypatch.setattr(publish, what, dying)


def test_a_backup_copy_killed_between_its_files_is_read_whole(tmp_path: Path, monkeypatch):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "backup"
    now = time.time()
    old, new = keras_slot(memory, 1, 1, now - 20), keras_slot(memory, 2, 2, now - 10)
    assert copy(old, target)
    kill_after(monkeypatch, 1)  # the weights renamed into place, not the metadata
    with pytest.raises(Killed):
        copy(new, target)
    monkeypatch.undo()
    # A restore (after the dead agent's marker went stale) reads the new save whole.
    memslots.wait_for_copy(str(target))
    assert backup(target) == ((new / "latest.weights.h5").read_bytes(), {"epoch": 2, "batch": -1})
    assert saved_names(target) == ["latest.weights.h5", "training_metadata.json"]


def test_a_copy_killed_before_its_commit_leaves_the_previous_save(tmp_path: Path, monkeypatch):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "backup"
    now = time.time()
    old, new = keras_slot(memory, 1, 1, now - 20), keras_slot(memory, 2, 2, now - 10)
    assert copy(old, target)
    kill_after(monkeypatch, 1, "stage")  # the weights staged aside, the metadata not
    with pytest.raises(Killed):
        copy(new, target)
    monkeypatch.undo()
    memslots.wait_for_copy(str(target))
    assert backup(target) == ((old / "latest.weights.h5").read_bytes(), {"epoch": 1, "batch": -1})
    # The next copy removes what the dead one left, then completes.
    newest = keras_slot(memory, 3, 3, now - 5)
    assert copy(newest, target)
    assert backup(target)[1]["epoch"] == 3
    assert saved_names(target) == ["latest.weights.h5", "training_metadata.json"]


def test_the_next_copy_rolls_a_committed_one_forward_first(tmp_path: Path, monkeypatch):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "ckpt"
    now = time.time()
    assert copy(make_slot(memory, 1, "ckpt-1", 100, ["ckpt-1"], saved=now - 30), target)
    kill_after(monkeypatch, 2)  # data and index in place, the state file not
    with pytest.raises(Killed):
        copy(make_slot(memory, 2, "ckpt-2", 100, ["ckpt-2"], saved=now - 20), target)
    monkeypatch.undo()
    publish.sweep(str(target))  # the agent's next copy starts so
    assert 'model_checkpoint_path: "ckpt-2"' in (target / "checkpoint").read_text()
    assert (target / "ckpt-2.index").exists() and not (target / publish.JOURNAL).exists()


def test_a_full_disk_leaves_the_directory_as_it_was(tmp_path: Path, monkeypatch):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "backup"
    now = time.time()
    old, new = keras_slot(memory, 1, 1, now - 20), keras_slot(memory, 2, 2, now - 10)
    assert copy(old, target)
    real = publish.stage

    def no_room(source, folder, name, when=None):
        real(source, folder, name, when)
        if name == "training_metadata.json":
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(publish, "stage", no_room)
    with pytest.raises(OSError):
        copy(new, target)
    assert backup(target)[1]["epoch"] == 1
    assert saved_names(target) == ["latest.weights.h5", "training_metadata.json"]


def test_a_late_drop_never_removes_a_later_save(tmp_path: Path):
    memory, target = tmp_path / "memory" / "worker0", tmp_path / "backup"
    now = time.time()
    assert copy(keras_slot(memory, 1, 4, now - 10), target)  # a later fit's backup
    drop = memory / "s-00000002"
    drop.mkdir()
    memslots.seal(str(drop), {"target": str(target), "kind": "drop", "copy": True,
                              "files": [], "time": now - 60})  # an earlier fit's end, late
    assert not copy(drop, target)
    assert backup(target)[1]["epoch"] == 4
    memslots.seal(str(drop), {"target": str(target), "kind": "drop", "copy": True,
                              "files": [], "time": now})
    assert copy(drop, target) and not target.exists()
