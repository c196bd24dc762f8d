"""Saves more often than the script's: the memory tier's own cadence.

With `checkpoint: {memory: true, memory_interval: N}` (MGPU_MEMORY_INTERVAL)
a save to memory costs a fraction of a second (runtime/memtier.py), so the
runtime takes one every N training steps besides the script's own, and a
kill -9 throws away at most N steps, not the script's save interval. Zero
code: the extra saves are the script's own saver's, called between two steps:

- Keras `BackupAndRestore` (Keras 3 and tf_keras), whatever its `save_freq`:
  after the batch whose step count crosses a multiple of N (the optimizer's
  `iterations`, read once at each epoch's start and counted on from the
  batches: no read inside the loop), the callback saves, unless the script's
  own save follows at this epoch's end. Every worker of a
  MultiWorkerMirroredStrategy counts the same steps from the same restored
  counter, so every worker saves at the same step (a save is collective)
  without a word between them.
- A restore of such a save resumes in the middle of its epoch: tf_keras counts
  from it itself (its `_ckpt_saved_batch`; the runtime reads a mid-epoch save
  as one; runtime/epochinput.py continues the epoch's input there, or, for an
  input it cannot carry, keeps the saves at epoch ends); for Keras 3,
  whose own restore knows the epoch only, the save's `training_metadata.json`
  also holds `mgpu_batches` (the batches of the epoch done) and the restored
  `fit` skips that many batches of its first epoch (read and dropped, not
  trained; runtime/epochinput3.py, which on TensorFlow also replays a seeded
  shuffle's order, and keeps an input it cannot carry at epoch ends: its
  `deferred`). Either way the epoch then trains the batches the
  uninterrupted one trained next (arrays, or a dataset read anew each epoch).

Not for `ModelCheckpoint` (a file per epoch or per best value, which no
restart reads back by itself) nor a custom loop's `tf.train.CheckpointManager`
(only the script knows where between its steps its state is whole, and a
thread saving meanwhile would break the collectives' order): those keep the
script's cadence, said at start. A memory tier that filled up stops the extra
saves (they would go to the shared directory).

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType

from .epochinput import skipped_in  # standard library only at import
from .epochinput3 import deferred

ENV = "MGPU_MEMORY_INTERVAL"
_MARK = "_mgpu_memory_cadence"


def interval() -> int:
    try:
        return max(0, int(os.environ.get(ENV) or 0))
    except ValueError:
        return 0


def enabled() -> bool:
    return interval() > 0 and bool(os.environ.get("MGPU_MEMORY_DIR"))


def _wrap(cls: type, name: str, make) -> None:
    original = cls.__dict__.get(name) or getattr(cls, name, None)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def _in_memory(callback) -> bool:
    """The callback's saves go to memory (not a URL's, nor a full tier's):
    an extra save never lands on the shared directory."""
    from . import memtier

    state = getattr(callback, "_training_state", None)  # tf_keras: its manager's
    manager = getattr(state, "write_checkpoint_manager", None)
    redirected = getattr(callback, "_mgpu_target", None) or getattr(manager, "_mgpu_target", None)
    return bool(redirected) and not memtier.full()


def _step(model) -> int:
    from . import steps

    return steps.read_iterations(getattr(model, "optimizer", None)) or 0


# --- the cadence, common to both Kerases ------------------------------------

def _train_begin(original):
    def begin(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        self._mgpu_saved_at = _step(self.model)  # the restored step: the last save
        if _legacy(self):  # Keras 3: runtime/epochinput3.py reads its batches back
            _resume_tf_keras(self)
        return result
    return begin


def _epoch_begin(original):
    def begin(self, epoch, *args, **kwargs):
        result = original(self, epoch, *args, **kwargs)
        self._mgpu_epoch, self._mgpu_base, self._mgpu_first = epoch, _step(self.model), None
        return result
    return begin


def _batch_begin(original):
    def begin(self, batch, *args, **kwargs):
        if getattr(self, "_mgpu_first", 0) is None:
            self._mgpu_first = batch  # the epoch's first batch run (a resumed one: not 0)
            # A batch skipped before it (runtime/epochinput.py) moved the step counter
            # after on_epoch_begin read it.
            self._mgpu_base += skipped_in(self.model, self._mgpu_epoch, 0, batch - 1)
        return original(self, batch, *args, **kwargs)
    return begin


def _batch_end(original):
    def end(self, batch, *args, **kwargs):
        result = original(self, batch, *args, **kwargs)
        if getattr(self, "_mgpu_base", None) is None or getattr(self, "_mgpu_first", None) is None:
            return result
        step = self._mgpu_base + batch - self._mgpu_first + 1
        every = interval()
        if step // every > self._mgpu_saved_at // every and not _epoch_save_follows(self, batch) \
                and _in_memory(self):
            _extra_save(self, batch)
            self._mgpu_saved_at = step
        return result
    return end


def _epoch_end(original):
    def end(self, epoch, *args, **kwargs):
        if _legacy(self) and isinstance(_steps(self), int):  # a whole epoch: its last batch
            self._training_state._ckpt_saved_batch.assign(_steps(self) - 1)
        result = original(self, epoch, *args, **kwargs)
        if getattr(self, "save_freq", None) == "epoch":
            self._mgpu_saved_at = _step(self.model)
        return result
    return end


def _steps(callback) -> int | None:
    steps = (getattr(callback, "params", None) or {}).get("steps")
    return steps if isinstance(steps, int) and steps > 0 else None


def _epoch_save_follows(callback, batch: int) -> bool:
    steps = _steps(callback)
    return getattr(callback, "save_freq", None) == "epoch" and steps is not None \
        and batch + 1 >= steps


def _extra_save(callback, batch: int) -> None:
    if _legacy(callback):  # tf_keras: its training state, the batch it holds
        callback._training_state._ckpt_saved_batch.assign(batch)
        callback._backup(epoch=callback._mgpu_epoch, batch=batch)
        return
    if deferred(callback, batch + 1):  # an input a restart cannot continue mid-epoch
        return
    callback._current_epoch = callback._mgpu_epoch  # Keras 3 sets it at epoch ends only
    callback._mgpu_batches = batch + 1
    try:
        callback._save_model()
    finally:
        callback._mgpu_batches = None


def _legacy(callback) -> bool:
    return hasattr(type(callback), "_backup")  # tf_keras' BackupAndRestore


def _implements_batch_hooks(original):
    def implements(self, *args, **kwargs):
        return True  # tf_keras calls batch hooks only for callbacks that ask
    return implements


# --- tf_keras: a mid-epoch save read as one -----------------------------------

def _resume_tf_keras(callback) -> None:
    state = getattr(callback, "_training_state", None)
    if state is None or getattr(state, "_save_freq", None) != "epoch":
        return  # a batch cadence of the script's own: tf_keras reads the batch itself
    original = state.maybe_load_initial_counters_from_ckpt

    def load(steps_per_epoch, initial_epoch, mode):
        epoch, batch = int(state._ckpt_saved_epoch.numpy()), int(state._ckpt_saved_batch.numpy())
        if str(mode) == "train" and isinstance(steps_per_epoch, int) and epoch >= 0 \
                and 0 <= batch < steps_per_epoch - 1:
            return epoch, batch + 1  # in the middle of its epoch: the next batch
        return original(steps_per_epoch, initial_epoch, mode)

    state.maybe_load_initial_counters_from_ckpt = load


def on_keras(module: ModuleType) -> None:
    backup = getattr(module.callbacks, "BackupAndRestore", None)
    if backup is None:
        return
    for name, make in (("on_train_begin", _train_begin), ("on_epoch_begin", _epoch_begin),
                       ("on_train_batch_begin", _batch_begin),
                       ("on_train_batch_end", _batch_end), ("on_epoch_end", _epoch_end)):
        _wrap(backup, name, make)
    if "_backup" in backup.__dict__:  # tf_keras
        _wrap(backup, "_implements_train_batch_hooks", _implements_batch_hooks)
    # Either Keras' first epoch's input: runtime/epochinput.py, epochinput3.py.


HOOKS = {"keras": on_keras, "tf_keras": on_keras}
