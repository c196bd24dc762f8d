"""Keras 3's `BackupAndRestore` and `ModelCheckpoint`, made multi-worker aware.

They are not: every worker creates the same directory and writes the same
files. Here, on a worker other than the chief, they write to a private
temporary directory that is deleted at once; every worker still *reads* the
shared backup on restart, so all of them resume from the chief's state. Each
fix checks first that the code it patches is what it expects (`CannotPatch`
otherwise) and that upstream has not made the callback chief-aware itself.

The chief's backup is written aside and renamed into place (`atomic_backups`).
Applied under TensorFlow (runtime/keras_compat.py's hooks) and JAX
(runtime/keras_jax.py). Standard library only; must not import the launcher
side.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from .keras_patch import (
    MARK,
    CannotPatch,
    UntestedKerasError,
    expect_params,
    is_chief,
    keras_version,
    refusal_message,
    source_of,
)


def _chief_aware(source: str) -> bool:
    """Upstream made the callback multi-worker aware (a fix would be in the way)."""
    return any(word in source for word in ("is_chief", "should_checkpoint", "_chief"))


def _in_memory_tier(callback) -> bool:
    """The memory tier pointed the callback's files into this task's private folder."""
    root = os.environ.get("MGPU_MEMORY_DIR")
    return bool(root) and any(isinstance(v, str) and v.startswith(os.path.join(root, ""))
                              for v in vars(callback).values())


def fix_backup_and_restore(cls: type) -> str:
    """Non-chief workers back up to a private temporary dir; every worker restores.

    Needs `_save_model(self)` that writes under `self.backup_dir`; the files it
    writes are whatever instance attributes hold paths inside that directory
    (Keras 3.3: weights and metadata; 3.10+: also their `.bkp` copies).
    """
    if cls.__dict__.get(MARK):
        return "patched"
    original_save = cls.__dict__.get("_save_model")
    expect_params(original_save, ("self",), "BackupAndRestore._save_model")
    original_end = cls.__dict__.get("on_train_end")
    expect_params(original_end, ("self", "logs"), "BackupAndRestore.on_train_end")
    if "self.backup_dir" not in source_of(cls.__init__):
        raise CannotPatch("BackupAndRestore no longer keeps self.backup_dir")
    if _chief_aware(source_of(original_save)):
        return "not needed"

    def _save_model(self):
        if is_chief():
            return original_save(self)
        import shutil
        import tempfile

        # A fresh scratch dir per save, deleted at once: a worker killed
        # between saves leaves nothing behind.
        shared_dir, scratch = self.backup_dir, tempfile.mkdtemp(prefix="mgpu-backup-")
        inside = os.path.join(str(shared_dir), "")
        shared = {name: value for name, value in vars(self).items()
                  if isinstance(value, str) and value.startswith(inside)}
        if not shared and _in_memory_tier(self):
            shutil.rmtree(scratch, ignore_errors=True)
            return original_save(self)  # already this task's own folder (runtime/memtier.py)
        if not shared:
            shutil.rmtree(scratch, ignore_errors=True)
            raise UntestedKerasError(refusal_message(keras_version(), [
                "BackupAndRestore keeps no file path inside backup_dir"]))
        self.backup_dir = scratch
        for name, value in shared.items():
            setattr(self, name, os.path.join(scratch, value[len(inside):]))
        try:
            return original_save(self)
        finally:
            self.backup_dir = shared_dir
            for name, value in shared.items():
                setattr(self, name, value)
            shutil.rmtree(scratch, ignore_errors=True)

    def on_train_end(self, logs=None):
        if is_chief():  # only the chief deletes the shared backup
            return original_end(self, logs)
        return None

    cls._save_model = _save_model
    cls.on_train_end = on_train_end
    setattr(cls, MARK, True)
    return "patched"


def fix_model_checkpoint(cls: type) -> str:
    """Non-chief workers save to a temporary path deleted right after the save."""
    if cls.__dict__.get(MARK):
        return "patched"
    original_save = cls.__dict__.get("_save_model")
    original_path = cls.__dict__.get("_get_file_path")
    expect_params(original_save, ("self", "epoch", "batch", "logs"),
                   "ModelCheckpoint._save_model")
    expect_params(original_path, ("self", "epoch", "batch", "logs"),
                   "ModelCheckpoint._get_file_path")
    if _chief_aware(source_of(original_save)):
        return "not needed"

    def _get_file_path(self, epoch, batch, logs):
        path = original_path(self, epoch, batch, logs)
        scratch = self.__dict__.get("_mgpu_scratch")
        if scratch is None:
            return path
        return os.path.join(scratch, os.path.basename(path))

    def _save_model(self, epoch, batch, logs):
        if is_chief():
            return original_save(self, epoch, batch, logs)
        import tempfile

        self._mgpu_scratch = tempfile.mkdtemp(prefix="mgpu-checkpoint-")
        try:
            return original_save(self, epoch, batch, logs)
        finally:
            import shutil

            shutil.rmtree(self.__dict__.pop("_mgpu_scratch"), ignore_errors=True)

    cls._get_file_path = _get_file_path
    cls._save_model = _save_model
    setattr(cls, MARK, True)
    return "patched"


def atomic_backups(cls: type, chief: Callable[[], bool]) -> None:
    """The chief writes its backup beside the real files, then renames them
    into place: Keras 3 writes `latest.weights.h5` in place, and a chief
    stopped mid-save by a teardown (a peer died) left a truncated file that
    every later generation failed to load (seen under JAX; under TensorFlow
    a save outlasting the crash teardown's grace could do the same)."""
    if cls.__dict__.get("_mgpu_atomic"):
        return
    inner = cls._save_model
    names = ("_weights_path", "_training_metadata_path")  # metadata last: it names the epoch

    def _save_model(self):
        if not chief():
            return inner(self)
        import shutil
        import tempfile

        final = {name: getattr(self, name) for name in names}
        # Beside the files (the backup directory, or the memory tier's folder
        # in /dev/shm it pointed them to): a rename across filesystems fails.
        folder = os.path.dirname(final["_weights_path"]) or self.backup_dir
        os.makedirs(folder, exist_ok=True)
        scratch = tempfile.mkdtemp(prefix=".mgpu-saving-", dir=folder)
        if self.double_checkpoint:  # Keras' own copy would look in the scratch dir
            for current, previous in ((self._weights_path, self._prev_weights_path),
                                      (self._training_metadata_path,
                                       self._prev_training_metadata_path)):
                if os.path.exists(current):
                    shutil.copyfile(current, previous)
        try:
            for name in names:
                setattr(self, name, os.path.join(scratch, os.path.basename(final[name])))
            result = inner(self)
            for name in names:
                os.replace(getattr(self, name), final[name])
            return result
        finally:
            for name, path in final.items():
                setattr(self, name, path)
            shutil.rmtree(scratch, ignore_errors=True)

    cls._save_model = _save_model
    cls._mgpu_atomic = True
