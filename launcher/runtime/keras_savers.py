"""Keras 3's `BackupAndRestore` and `ModelCheckpoint`, made multi-worker aware.

They are not: every worker creates the same directory and writes the same
files. Here, on a worker other than the chief, they write to a private
temporary directory that is deleted at once; every worker still *reads* the
shared backup on restart, so all of them resume from the chief's state. Each
fix checks first that the code it patches is what it expects (`CannotPatch`
otherwise) and that upstream has not made the callback chief-aware itself.

Applied under TensorFlow (runtime/keras_compat.py's hooks) and JAX
(runtime/keras_jax.py). Standard library only; must not import the launcher
side.
"""

from __future__ import annotations

import os

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
