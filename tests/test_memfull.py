"""A full memory tier (launcher/runtime/memtier.py): every saver kind saves
directly to its directory from then on, the first save included, said once
(issue 55: Keras 3's BackupAndRestore kept saving into its memory folder)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from launcher.runtime import memslots, memtier


class Backup:
    """Keras 3's BackupAndRestore, as the hooks see it: its paths, its save."""

    def __init__(self, backup_dir: str, model: object = None) -> None:
        self.backup_dir = backup_dir
        self._weights_path = os.path.join(backup_dir, "latest.weights.h5")
        self._training_metadata_path = os.path.join(backup_dir, "training_metadata.json")
        self.model = model
        self.epoch = 0
        self.fail: OSError | None = None

    def on_train_begin(self, logs=None) -> None:
        pass

    def _save_model(self) -> None:
        os.makedirs(os.path.dirname(self._weights_path), exist_ok=True)
        Path(self._weights_path).write_bytes(b"w" * 100)
        if self.fail is not None and self._weights_path.startswith(memtier._root()):
            raise self.fail  # the memory folder has no room
        Path(self._training_metadata_path).write_text(json.dumps({"epoch": self.epoch}))


class Checkpoint:
    """ModelCheckpoint, as the hooks see it."""

    def __init__(self, filepath: str) -> None:
        self.filepath = filepath
        self.model = None
        self.fail = False

    def _save_model(self) -> None:
        if self.fail and self.filepath.startswith(memtier._root()):
            raise OSError(errno.ENOSPC, "No space left on device")
        Path(self.filepath).write_bytes(b"m" * 100)


class Model:
    weights = [type("V", (), {"shape": (1000, 1000), "dtype": "float32"})()]  # 4 MB
    optimizer = None


@pytest.fixture
def tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    memory = tmp_path / "shm" / "worker0"
    memory.mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("MGPU_MEMORY_DIR", str(memory))
    monkeypatch.delenv("MGPU_PROGRESS_FD", raising=False)
    monkeypatch.setattr(memtier, "_state", {"seq": 0, "told": False, "full": False,
                                            "last_bytes": 0})
    monkeypatch.setattr(memtier, "_chief", lambda: False)  # no end wait registered
    free = {"bytes": 10**9}
    monkeypatch.setattr(memslots, "free_bytes", lambda root: free["bytes"])
    return {"memory": memory, "free": free, "dir": tmp_path / "ckpt"}


def hooked(callback: object) -> tuple:
    kind = type(callback)
    begin = memtier._backup_begin(kind.on_train_begin) if hasattr(kind, "on_train_begin") \
        else None
    return begin, memtier._keras_save(kind._save_model)


def test_a_backup_saves_to_its_directory_once_memory_is_full(tier, capsys):
    backup = Backup(str(tier["dir"]))
    begin, save = hooked(backup)
    begin(backup)
    save(backup)  # in memory: a slot, the directory not written by the save
    assert len(memslots.slots(str(tier["memory"]))) == 1
    assert not (tier["dir"] / "latest.weights.h5").exists()
    tier["free"]["bytes"] = 150  # less than twice the last save
    for epoch in (1, 2):
        backup.epoch = epoch
        save(backup)
    assert json.loads((tier["dir"] / "training_metadata.json").read_text()) == {"epoch": 2}
    assert (tier["dir"] / "latest.weights.h5").exists()
    assert len(memslots.slots(str(tier["memory"]))) == 1  # nothing more in memory
    work = memslots.working(str(tier["memory"]), str(tier["dir"]), "backup")
    assert os.listdir(work) == []
    assert capsys.readouterr().err.count("memory tier full") == 1


def test_a_first_save_that_cannot_fit_goes_to_the_directory(tier, capsys):
    tier["free"]["bytes"] = 5 * 2**20  # less than twice the model's 4 MB
    backup = Backup(str(tier["dir"]), Model())
    begin, save = hooked(backup)
    begin(backup)
    save(backup)
    assert (tier["dir"] / "training_metadata.json").exists()
    assert memslots.slots(str(tier["memory"])) == []
    assert capsys.readouterr().err.count("memory tier full") == 1


@pytest.mark.parametrize("kind", ["backup", "model"])
def test_a_save_that_finds_no_space_is_made_in_its_directory(tier, capsys, kind):
    if kind == "backup":
        callback: Backup | Checkpoint = Backup(str(tier["dir"]))
        callback.fail = OSError(errno.ENOSPC, "No space left on device")
        saved = tier["dir"] / "training_metadata.json"
    else:
        callback = Checkpoint(str(tier["dir"] / "model.keras"))
        callback.fail = True
        saved = tier["dir"] / "model.keras"
        tier["dir"].mkdir()
    begin, save = hooked(callback)
    if begin is not None:
        begin(callback)
    save(callback)  # no exception into fit()
    assert saved.exists()
    assert memslots.slots(str(tier["memory"])) == []
    for name in os.listdir(tier["memory"]):  # nothing left behind in memory
        assert os.listdir(tier["memory"] / name) == [], name
    save(callback)
    assert capsys.readouterr().err.count("memory tier full") == 1
    if kind == "model":
        assert callback.filepath == str(saved)


def test_an_h5py_or_tensorflow_worded_no_space_is_known():
    assert memslots.no_space(OSError(errno.ENOSPC, "x"))
    assert memslots.no_space(RuntimeError("Unable to write (file write failed: errno = 28)"))
    try:
        try:
            raise OSError(errno.ENOSPC, "disk")
        except OSError as inner:
            raise ValueError("save failed") from inner
    except ValueError as outer:
        assert memslots.no_space(outer)
    assert not memslots.no_space(ValueError("shape mismatch"))
    assert memslots.estimate(Model()) == 4_000_000
    assert memslots.estimate(object()) == 0


def test_the_end_waits_for_the_last_copy_of_each_saver_of_a_directory(tier, monkeypatch):
    monkeypatch.setattr(memtier, "_chief", lambda: True)
    monkeypatch.setattr(memtier, "_pending", {("registered",): "/none"})  # no atexit added
    directory = str(tier["dir"])
    for kind, files in (("manager", ["checkpoint", "ckpt-1.index"]),
                        ("keras", ["latest.weights.h5", "training_metadata.json"])):
        slot = memtier._new_slot()
        for name in files:
            Path(slot, name).write_text(name)
        memtier._publish(slot, directory, kind, "", None)
    waited = [key for key in memtier._pending if key[0] == directory]
    assert len(waited) == 2, memtier._pending  # the backup's save kept the manager's
