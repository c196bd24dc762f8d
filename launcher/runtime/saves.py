"""Checkpoint saves timed, for the goodput ledger (launcher/job/goodput.py).

Post-import hooks wrap the methods that save a checkpoint:

- Keras 3 and tf_keras: `BackupAndRestore` (`_save_model`, tf_keras' `_backup`)
  and `ModelCheckpoint` (`_save_model`);
- TensorFlow: `tf.train.CheckpointManager.save` (a custom loop's saves, and
  tf_keras' BackupAndRestore underneath).

Each save's duration is added up here and sent with the next step report as
`save_s` (`runtime.write_progress`): the launcher counts that time as
checkpointing, not training. A save inside a save (tf_keras' backup calls its
CheckpointManager) counts once. A script that saves some other way can say
how long it took: `runtime.report_checkpoint(step, save_s=seconds)`.

The cost: two clock reads per save. Standard library only at import time;
must not import the launcher side.
"""

from __future__ import annotations

import functools
import threading
import time
from types import ModuleType

_MARK = "_mgpu_times_saves"

_lock = threading.Lock()
_pending_s = 0.0  # saved since the last report
_inside = threading.local()


def take() -> float:
    """The seconds spent saving since the last call (0.0: none)."""
    global _pending_s
    with _lock:
        seconds, _pending_s = _pending_s, 0.0
    return seconds


def note(seconds: float) -> None:
    global _pending_s
    with _lock:
        _pending_s += max(seconds, 0.0)


def pending() -> bool:
    with _lock:
        return _pending_s > 0.0


def timed(cls: type, name: str) -> None:
    """Wrap `cls.<name>` (a method that saves) to time it (once)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def save(*args, **kwargs):
        if getattr(_inside, "saving", False):
            return original(*args, **kwargs)
        _inside.saving = True
        began = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            _inside.saving = False
            note(time.monotonic() - began)

    setattr(save, _MARK, True)
    setattr(cls, name, save)


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3) or `tf_keras` imported: its checkpoint callbacks."""
    callbacks = module.callbacks
    for cls_name, methods in (("BackupAndRestore", ("_save_model", "_backup")),
                              ("ModelCheckpoint", ("_save_model",))):
        cls = getattr(callbacks, cls_name, None)
        for method in methods if cls is not None else ():
            timed(cls, method)


def on_tensorflow(module: ModuleType) -> None:
    timed(module.train.CheckpointManager, "save")


HOOKS = {"keras": on_keras, "tf_keras": on_keras, "tensorflow": on_tensorflow}
