"""Where a restarted task resumed training, read where its restore happens.

A script that never calls the runtime still restores its training state in
one of a few places; the step its optimizer holds right after is where it
resumed. Reported once per process, as `resumed` (the step), `resumed_epoch` (Keras
`fit`) and `resumed_dir` (the directory restored from, when known):

- Keras `fit` (Keras 3 on TensorFlow or JAX, tf_keras): the first epoch that
  begins, told by the callback the step counter's `fit` wrapper adds last
  (runtime.steps), so after `BackupAndRestore.on_train_begin` restored the
  weights, the optimizer and the epoch; that hook notes the backup directory;
- a custom loop: `tf.train.Checkpoint.restore` / `read` and
  `tf.train.CheckpointManager.restore_or_initialize`, once they return: the
  step count of the optimizer the checkpoint holds. A restore that finds
  nothing resumes at 0. A checkpoint that holds no optimizer (TF's custom-loop
  tutorial saves the model alone) restores at a step that cannot be read:
  `resumed_unknown` says why, never a guessed step (the launcher then says
  "unknown" where it would judge a resume). In graph mode (tf_keras'
  `load_weights` of a `ModelCheckpoint` save, the seed's shape) the restore
  runs after `read` returned: the first epoch of `fit` tells it;
- TF1 graph code: `tf.compat.v1.train.Saver.restore` (called directly or by a
  `MonitoredTrainingSession`'s chief as its session forms), once it returned:
  the global step of the session's graph, read once (else the `-N` of the
  path restored; else `resumed_unknown`).

A restore inside a backup's own `on_train_begin` is the backup's: told by the
epoch that follows. The cost: a few attribute reads per restore, once.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
import weakref
from types import ModuleType

_MARK = "_mgpu_reads_restores"
_told = False  # this process reported where it resumed
_told_unknown = False  # ... or that a restore's step cannot be read
_backup_dir: str | None = None  # the last BackupAndRestore that restored (or load_weights)
_inside = threading.local()
# With the memory tier: the copy a restore read (memtier.py): `resumed_from`
# (memory, shared), `resumed_host`, `resumed_copy` (its path), `resumed_target`.
copy_source: dict[str, str] | None = None


def tell(step: int | None, epoch: int | None = None, directory: str | None = None) -> None:
    """Report where this process resumed (once; only in a restarted generation)."""
    global _told
    if _told or step is None:
        return
    _told = True
    from launcher import runtime

    source = {k: runtime.short_path(v) for k, v in (copy_source or {}).items()}
    if source and directory and os.environ.get("MGPU_MEMORY_DIR", "\0") in directory:
        directory = source.get("resumed_target")  # the memory folder is the tier's
    if epoch is not None:
        runtime.write_progress({**source, "resumed": int(step), "resumed_epoch": int(epoch),
                                **({"resumed_dir": runtime.short_path(directory)}
                                   if directory else {})})
        return
    if source:
        runtime.write_progress({**source, "resumed": int(step), "time": time.time(),
                                **({"resumed_dir": runtime.short_path(directory)}
                                   if directory else {})})
        return
    runtime.report_resumed(step, directory)


def first_epoch(model, epoch: int) -> None:
    """`fit`'s first epoch began (after every callback's `on_train_begin`)."""
    from . import steps

    tell(steps.step_of(model), epoch, _backup_dir)


def _wrap(cls: type, name: str, after) -> None:
    """Wrap `cls.<name>` to call `after(instance, args, kwargs, result)` once it
    returned (the outermost of nested restores only)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def restore(*args, **kwargs):
        if getattr(_inside, "restoring", False):
            return original(*args, **kwargs)
        _inside.restoring = True
        try:
            result = original(*args, **kwargs)
        finally:
            _inside.restoring = False
        try:
            after(args[0], args, kwargs, result)
        except Exception:  # noqa: BLE001, S110 - a layout we do not know: no report
            pass
        return result

    setattr(restore, _MARK, True)
    setattr(cls, name, restore)


def _backup_restored(callback, args, kwargs, result) -> None:
    global _backup_dir
    directory = getattr(callback, "backup_dir", None)
    _backup_dir = os.path.abspath(str(directory)) if directory else None


def _checkpoint_restored(checkpoint, args, kwargs, result) -> None:
    path = args[1] if len(args) > 1 else kwargs.get("save_path")
    _restored(checkpoint, bool(path), os.path.dirname(os.fspath(path)) if path else None)


def _manager_restored(manager, args, kwargs, result) -> None:
    # restore_or_initialize returns the path it restored, None when it initialized
    _restored(getattr(manager, "_checkpoint", None), result is not None,
              getattr(manager, "_mgpu_target", None) or getattr(manager, "directory", None))


UNKNOWN_STEP = ("the checkpoint holds no optimizer, so the step it was saved at cannot "
                "be read (add it: tf.train.Checkpoint(model=..., optimizer=...))")


def _restored(checkpoint, found: bool, directory: str | None) -> None:
    """A custom loop's restore returned: `found` a checkpoint or initialized."""
    held, step = _step_in(checkpoint)
    if not held and found:
        tell_unknown(UNKNOWN_STEP, directory)
        return
    from . import steps

    # An optimizer whose count is not made yet (restored when it is: tf_keras'
    # legacy optimizers before their first step): the step watcher's count.
    step = step if step is not None else steps.current_step()
    if step is None and found and directory:  # graph mode: `fit`'s first epoch tells it
        global _backup_dir
        _backup_dir = os.path.abspath(directory)
    tell(step, directory=directory)


def tell_unknown(why: str, directory: str | None) -> None:
    """Report a restore whose step cannot be read (once; a later restore that has
    a step still tells it: a backbone warm-started from a model-only checkpoint,
    then the training checkpoint restored)."""
    global _told_unknown
    if _told or _told_unknown:
        return
    _told_unknown = True
    from launcher import runtime

    runtime.write_progress({"resumed_unknown": why, "time": time.time(),
                            **({"resumed_dir": runtime.short_path(directory)}
                               if directory else {})})


def _step_in(checkpoint) -> tuple[bool, int | None]:
    """(does the checkpoint hold an optimizer, the highest step count among them).
    Optimizers are looked for among what it tracks, a few levels down (a model's,
    a list's as in `optimizers=[...]`, a dict's, a module's), by what they are,
    not by name."""
    from . import steps

    held, counts = False, []
    for optimizer in _optimizers(checkpoint):
        held = True
        count = steps.read_iterations(optimizer)
        if count is not None:
            counts.append(count)
    return held, (max(counts) if counts else None)


def _optimizers(root, depth: int = 4):
    """The optimizers among what `root` tracks (TensorFlow's trackable children,
    else its attributes), `depth` levels down at most."""
    seen: set[int] = set()
    level = [root] if root is not None else []
    for _ in range(depth + 1):
        below = []
        for value in level:
            if id(value) in seen:
                continue
            seen.add(id(value))
            if (hasattr(value, "_iterations") or "iterations" in getattr(value, "__dict__", {})) \
                    and hasattr(value, "apply_gradients"):  # Keras', or a TFOptimizer
                yield value
                continue
            below.extend(_children(value))
        level = below


def _children(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list | tuple):
        return list(value)
    try:
        children = list(value._trackable_children().values())
    except Exception:  # noqa: BLE001 - not a trackable: its attributes, if any
        return list(getattr(value, "__dict__", {}).values())[:64]
    # A Checkpoint(root=...) holds its root apart (tf_keras' `model._checkpoint`,
    # which `load_weights` reads, by weak reference).
    root = getattr(value, "_root", None)
    root = root() if isinstance(root, weakref.ref) else root
    return children if root is None else [*children, root]


def _backup_ended(callback, args, kwargs, result) -> None:
    """`fit` ended: BackupAndRestore deletes its backup then (both Kerases), so a
    restart after it (a failure in the script's code after `fit`) finds nothing
    to restore. Said (`deleted`: the directory) when no file is left in it
    (tf_keras removes its `chief` folder and keeps the directory; the other
    workers' `workertemp_N` scratch folders are theirs to remove)."""
    directory = getattr(callback, "backup_dir", None)
    if not directory or "://" in os.fspath(directory):  # gs://...: not for os.walk
        return
    if not _holds_files(os.fspath(directory)):
        from launcher import runtime

        runtime.write_progress({"deleted": runtime.short_path(os.path.abspath(
            os.fspath(directory))), "time": time.time()})


def _holds_files(directory: str) -> bool:
    for _, folders, files in os.walk(directory):
        if files:
            return True
        folders[:] = [f for f in folders if not f.startswith("workertemp")]
    return False


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3) or `tf_keras`: the backup's restore, noted for the epoch,
    and its deletion when `fit` ends."""
    backup = getattr(module.callbacks, "BackupAndRestore", None)
    if backup is not None:
        _wrap(backup, "on_train_begin", _backup_restored)
        _wrap(backup, "on_train_end", _backup_ended)


NO_GLOBAL_STEP = ("the graph has no global step and the checkpoint's name no step "
                  "(tf.compat.v1.train.get_or_create_global_step(), and "
                  "Saver.save(..., global_step=...))")


def _saver_restored(saver, args, kwargs, result) -> None:
    """A TF1 `Saver.restore(sess, save_path)` returned: the global step restored."""
    from . import saves

    session = args[1] if len(args) > 1 else kwargs.get("sess")
    path = args[2] if len(args) > 2 else kwargs.get("save_path")
    directory = os.path.dirname(os.fspath(path)) if path else None
    step = saves.global_step_of(session)
    if step is None and path:
        numbered = re.search(r"-(\d+)$", os.fspath(path))
        step = int(numbered.group(1)) if numbered else None
    if step is None:
        tell_unknown(NO_GLOBAL_STEP, directory)
        return
    tell(step, directory=directory)


def on_tensorflow(module: ModuleType) -> None:
    for name in ("restore", "read"):
        _wrap(module.train.Checkpoint, name, _checkpoint_restored)
    _wrap(module.train.CheckpointManager, "restore_or_initialize", _manager_restored)
    saver = sys.modules.get("tensorflow.python.training.saver")  # loaded with TensorFlow
    if saver is not None:
        _wrap(saver.Saver, "restore", _saver_restored)


HOOKS = {"keras": on_keras, "tf_keras": on_keras, "tensorflow": on_tensorflow}
