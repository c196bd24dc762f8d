"""A resumed epoch's input continues where its save left it (Keras 3 `fit`).

Keras 3's `BackupAndRestore` restores the epoch only: a save in the middle of
epoch e (its `save_freq=N`, the launcher's `memory_interval`,
runtime/memcadence.py) resumes `fit` at e's first batch, so without help the
epoch trains its first batches again, in a new process whose shuffle order
is another's. What runtime/epochinput.py does for tf_keras, here for Keras 3:

- a save in the middle of an epoch also writes `mgpu_batches` (the batches of
  the epoch done) in the backup's `training_metadata.json`, and the restore
  reads it back: the resumed epoch's iterator reads those batches and drops
  them (not trained), and the epoch's steps go on from there (the callbacks,
  the save cadence and the progress bar count on from the batch after them);
- on the TensorFlow backend, for `fit`'s tf.data input whose position can be
  carried (`epochinput.why_not`: a seeded shuffle, no Python, no stateful
  random op), the resumed epoch also reads the order it had uninterrupted: a
  dataset read anew each epoch draws its shuffle order from a seed generator
  that advances once per iterator made, and Keras' epoch iterator makes two an
  epoch (one at its start, one at its end; one where the data's length is
  unknown); the resumed process makes (and drops: no element read) as many
  first. One stream over the epochs (a
  `repeat()`ed dataset with `steps_per_epoch`) reads and drops the epochs
  before the resumed one too (said);
- where the position is carried and each step trains one batch, the batches
  the launcher names (MGPU_SKIP_BATCHES, runtime/epochinput.py) are read and
  dropped at their position, when the step is the one that went bad; the
  optimizer's step counter moves past each;
- on the TensorFlow backend, for an input whose position cannot be carried
  (arrays, a Python generator, an unseeded shuffle, `steps_per_epoch` over a
  finite dataset: `verdict`, which `epochinput.skip_blocker` says), the
  mid-epoch saves are not taken (said once, at the first), and the epoch's
  end is saved instead, as tf_keras': a restart trains the epoch again from
  its start and nothing twice (`deferred`; memcadence.py asks it too);
- on the JAX or torch backend the position is not carried: a mid-epoch save
  is taken only for arrays `fit` does not shuffle (every process reads them
  in one order: the batches done are dropped, exact); for any other input it
  is not taken, as above (`order_elsewhere`); no batch is skipped there
  (`epochinput.skip_blocker` says why).

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import json
from types import ModuleType

from .epochinput import (  # standard library only at import
    count_skip,
    is_the_one,
    say_once,
    skips_in,
    why_not,
    wrap,
)

KEY = "mgpu_batches"  # the metadata's: the batches of its epoch a mid-epoch save holds
_fit: dict = {}  # the `fit` under way: {"model", "initial"} (its training iterator claims it)
_resume: dict = {}  # what the restore left: {"model", "epoch", "step"}


# --- the saves and the restore (BackupAndRestore) ----------------------------

def _batch_end(original):
    """A save made at a batch's end is one in the middle of its epoch; of an
    input whose position cannot be carried, not taken (`deferred`)."""
    def end(self, batch, *args, **kwargs):
        self._mgpu_batches = int(batch) + 1
        if _reason(self):  # shadows every wrapper's too: no write, none reported
            self._save_model = lambda *a, **k: deferred(self, int(batch) + 1) and None
        try:
            return original(self, batch, *args, **kwargs)
        finally:
            self._mgpu_batches = None
            vars(self).pop("_save_model", None)
    return end


def _reason(callback) -> str:
    model = getattr(callback, "model", None)
    return getattr(model, "_mgpu_input", None) or getattr(model, "_mgpu_order", None) or ""


class _Told:
    """The `json` Keras' `_save_model` writes its metadata with, for one save:
    `mgpu_batches` goes into the very write (the file may be the chief's shared
    one, another worker's scratch copy: keras_savers.py; never read back)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def __getattr__(self, name: str):
        return getattr(json, name)

    def dumps(self, value, *args, **kwargs) -> str:
        if isinstance(value, dict) and "epoch" in value:
            value = {**value, KEY: self.batches}
        return json.dumps(value, *args, **kwargs)


def _save(module: ModuleType):
    def make(original):
        """`_save_model`: a mid-epoch save's metadata says its batches."""
        def save(self, *args, **kwargs):
            batches = getattr(self, "_mgpu_batches", None)
            if not batches or getattr(module, "json", None) is not json:
                return original(self, *args, **kwargs)
            module.json = _Told(batches)
            try:
                return original(self, *args, **kwargs)
            finally:
                module.json = json
        return save
    return make


def deferred(callback, batches: int) -> bool:
    """A mid-epoch save (`save_freq`, the launcher's `memory_interval`:
    runtime/memcadence.py asks before its own) of an input whose position
    cannot be carried is not taken (said once, when it was one before the
    epoch's last batch): its epoch's end is saved instead, so a restart trains
    that epoch again from its start and nothing twice."""
    reason = _reason(callback)
    if not reason:
        return False
    steps = (getattr(callback, "params", None) or {}).get("steps")
    if not isinstance(steps, int) or batches < steps:
        say_once(f"mgpu-launch: a save in the middle of an epoch (BackupAndRestore's "
                  f"save_freq, the launcher's memory_interval) is not taken: this fit's "
                  f"input cannot continue there after a restart ({reason}); saves are "
                  f"taken at epoch ends instead, and a restart trains its epoch again "
                  f"from the start (nothing twice)")
    callback._mgpu_owed = True
    return True


def _epoch_end(original):
    """The epoch's end saved in place of the mid-epoch saves not taken."""
    def end(self, epoch, *args, **kwargs):
        owed, self._mgpu_owed = getattr(self, "_mgpu_owed", False), False
        result = original(self, epoch, *args, **kwargs)
        if owed and self.save_freq != "epoch":  # "epoch": the original saved it
            self._save_model()  # the whole epoch: a restart goes on at the next one
        return result
    return end


def _train_begin(original):
    """The restore: where in its epoch the save was, for `fit`'s iterator."""
    def begin(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        try:
            with open(self._training_metadata_path, encoding="utf-8") as handle:
                metadata = json.load(handle)
            epoch, step = int(metadata["epoch"]), int(metadata.get(KEY) or 0)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return result  # no backup: a fresh start
        _resume.clear()
        if step > 0:
            _resume.update(model=self.model, epoch=epoch, step=step)
            self._last_batch_seen = step - 1  # its save cadence counts on from there
        return result
    return begin


# --- fit on JAX or torch: whether its order is the same in a new process ---

def _fitting_elsewhere(backend: str):
    """`fit` on the JAX or torch backend: its epoch's order, which the launcher
    does not carry there, is the same in a new process only for arrays that
    `fit` does not shuffle; else its mid-epoch saves are not taken (`deferred`)."""
    def make(original):
        def fit(self, *args, **kwargs):
            self._mgpu_order = order_elsewhere(backend, args, kwargs)
            try:
                return original(self, *args, **kwargs)
            finally:
                self._mgpu_order = None
        return fit
    return make


def order_elsewhere(backend: str, args: tuple, kwargs: dict) -> str:
    """Why a `fit(*args, **kwargs)` on `backend` cannot resume in the middle of
    an epoch in the order it had ("" for arrays read in order: not shuffled,
    each epoch a whole pass from the first batch)."""
    try:
        data = kwargs.get("x", args[0] if args else None)
        shuffle = kwargs.get("shuffle", args[8] if len(args) > 8 else True)
        per_epoch = kwargs.get("steps_per_epoch", args[12] if len(args) > 12 else None)
        parts = list(data.values()) if isinstance(data, dict) else \
            list(data) if isinstance(data, list | tuple) else [data]
        arrays = bool(parts) and all(
            type(p).__module__.partition(".")[0] in ("numpy", "jax", "jaxlib", "torch")
            and hasattr(p, "shape") for p in parts)
    except Exception as exc:  # noqa: BLE001 - arguments of a shape not known here
        return f"the launcher cannot follow its input ({type(exc).__name__})"
    if not arrays:
        return f"the input's position is not carried on Keras 3's {backend} backend"
    if shuffle:  # Keras' array adapter tests its truth
        return (f"fit shuffles its arrays (shuffle={shuffle!r}) and Keras 3's {backend} "
                "backend draws another order in a new process")
    if per_epoch:
        return ("steps_per_epoch cuts its arrays (their iterator runs on across epochs, "
                "a new process's starts at the first batch)")
    return ""


# --- fit's training iterator (TensorFlow backend) ----------------------------

def _fitting(original):
    def fit(self, *args, **kwargs):
        initial = kwargs.get("initial_epoch", args[11] if len(args) > 11 else 0)
        _fit.clear()
        _fit.update(model=self, initial=int(initial or 0))
        try:
            return original(self, *args, **kwargs)
        finally:
            _fit.clear()
            self._mgpu_iterator = None
    return fit


def _claim(original):
    """The first TFEpochIterator a `fit` makes is its training one."""
    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        model = _fit.pop("model", None)
        if model is not None:
            self._mgpu_fit, self._mgpu_initial = model, _fit.get("initial", 0)
            model._mgpu_input = verdict(self)
            model._mgpu_iterator = self
    return init


def _arm(original):
    """`fit` made its train function: its next epoch of the iterator is its
    first (the one before, `_maybe_symbolic_build`'s, reads one batch)."""
    def make(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        iterator = getattr(self, "_mgpu_iterator", None)
        if iterator is not None:
            iterator._mgpu_armed = True
        return result
    return make


def verdict(iterator) -> str:
    """Why this Keras 3 iterator's position cannot be carried ("" when it can)."""
    try:
        adapter = iterator.data_adapter
        if type(adapter).__name__ != "TFDatasetAdapter":
            return "it is not a tf.data dataset (Keras 3 carries those only)"
        if iterator.steps_per_epoch and adapter.num_batches:
            return "steps_per_epoch cuts a finite dataset (its iterator restarts across epochs)"
        return why_not(adapter.get_tf_dataset())
    except Exception as exc:  # noqa: BLE001 - an input of a shape not known here
        return f"the launcher cannot follow it ({type(exc).__name__})"


# --- the epochs: the resumed one's batches done dropped, named skips ---------

def _read(iterator, batches: int) -> bool:
    """Read `batches` batches and drop them; False when the data ran out."""
    try:
        for _ in range(batches):
            next(iterator)
    except StopIteration:
        return False
    except Exception as exc:
        if type(exc).__name__ != "OutOfRangeError":
            raise
        return False
    return True


def _start(iterator, model) -> tuple[int | None, int, int]:
    """(this epoch's number in `fit`, batches done before its save, batches of
    the epochs before it to read first: one stream), and the replay of the
    iterators a dataset read anew each epoch made before it."""
    plan = dict(_resume) if model is None or _resume.get("model") is model else {}
    _resume.clear()
    step = int(plan.get("step", 0))
    if model is None:
        return None, step, 0  # not fit's on TensorFlow: the batches done only
    if getattr(iterator, "_mgpu_epoch", None) is not None:
        iterator._mgpu_epoch += 1
        return iterator._mgpu_epoch, 0, 0
    initial = iterator._mgpu_initial
    epoch = iterator._mgpu_epoch = int(getattr(model, "_initial_epoch", None) or initial)
    epochs = max(0, epoch - initial)
    if model._mgpu_input or not epochs or plan.get("epoch", epoch) != epoch:
        return epoch, step, 0
    if iterator.steps_per_epoch:  # one stream over the epochs
        stream = epochs * iterator.steps_per_epoch
        say_once(f"mgpu-launch: this fit's input is one stream over its epochs (a repeated "
                  f"dataset): {stream + step} batches of it are read and dropped to "
                  f"continue where the save left it")
        return epoch, step, stream
    # Two iterators an epoch (its start's, its end's); one where the data's
    # length is unknown (each epoch runs out of its own).
    made = epochs * (2 if iterator.data_adapter.num_batches else 1)
    for _ in range(made):
        iter(iterator._get_iterator())  # made and dropped: the seed generator advances
    return epoch, step, 0


def _enumerate(original):
    """EpochIterator's epoch: the batches done before a mid-epoch save read
    and dropped, and in `fit` on TensorFlow the positions to skip."""
    def enumerate_iterator(self, *args, **kwargs):
        model = getattr(self, "_mgpu_fit", None)
        if model is not None and not getattr(self, "_mgpu_armed", False):
            yield from original(self, *args, **kwargs)  # the symbolic build's batch
            return
        epoch, done, stream = _start(self, model)
        wanted = skips_in(model, epoch) if model is not None else {}
        for item in original(self, *args, **kwargs):
            begin, end, iterator = item
            if stream and not _read(iterator, stream):
                return
            stream = 0
            if end < done:  # trained before the save
                if not _read(iterator, end - begin + 1):
                    return
                continue
            if begin == end and begin in wanted and is_the_one(model, epoch, begin,
                                                                wanted[begin]):
                if not _read(iterator, 1):
                    return
                count_skip(model, epoch, begin)
                continue
            yield item
    return enumerate_iterator


def on_tf_trainer(module: ModuleType) -> None:
    """`keras.src.backend.tensorflow.trainer`: fit's training iterator known."""
    wrap(module.TensorFlowTrainer, "fit", _fitting)
    wrap(module.TensorFlowTrainer, "make_train_function", _arm)
    wrap(module.TFEpochIterator, "__init__", _claim)


def on_epoch_iterator(module: ModuleType) -> None:
    wrap(module.EpochIterator, "_enumerate_iterator", _enumerate)


def on_backup(module: ModuleType) -> None:
    backup = module.BackupAndRestore
    wrap(backup, "on_train_batch_end", _batch_end)
    wrap(backup, "_save_model", _save(module))
    wrap(backup, "on_train_begin", _train_begin)
    wrap(backup, "on_epoch_end", _epoch_end)


def on_jax_trainer(module: ModuleType) -> None:
    wrap(module.JAXTrainer, "fit", _fitting_elsewhere("jax"))


def on_torch_trainer(module: ModuleType) -> None:
    wrap(module.TorchTrainer, "fit", _fitting_elsewhere("torch"))


HOOKS = {"keras.src.trainers.epoch_iterator": on_epoch_iterator,
         "keras.src.backend.tensorflow.trainer": on_tf_trainer,
         "keras.src.backend.jax.trainer": on_jax_trainer,
         "keras.src.backend.torch.trainer": on_torch_trainer,
         "keras.src.callbacks.backup_and_restore": on_backup}
