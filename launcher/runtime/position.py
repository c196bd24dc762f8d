"""Where this task is in its script, zero code: the phase, the epoch and its length.

Workers of MultiWorkerMirroredStrategy must call the same collectives in the
same order. When one of them is somewhere else (its input ran out a step
early, the chief alone evaluates or saves, EarlyStopping ended one worker's
`fit`), every process is alive and each waits for the others. The launcher
names that cause by comparing the tasks' positions (launcher/job/detect/lockstep.py);
this module keeps this task's:

- a post-import hook on `keras` and `tf_keras` wraps `Model.fit`, `evaluate`,
  `predict`, `save` and `save_weights` to keep the phase (training,
  evaluating, predicting, saving; outside them once one has run), and adds to
  `fit` one callback, called at each epoch's begin and end only, that keeps
  the epoch, the step counter at its start (`runtime.steps`) and, at its end,
  how many steps it had;
- on `tensorflow`, `tf.train.Checkpoint.save`/`write` and
  `CheckpointManager.save` count as saving (a custom loop's checkpoints);
- each change is reported at once (`runtime.write_progress`), and every
  progress report carries the position (`fields`). Nothing runs inside a
  training step. A call that raises leaves the position where it was (the
  place its peers last saw), noting whether a callback had asked `fit` to
  stop (`stop_training`).

At `fit`'s start, an input that can be seen to make workers fall out of step
is warned of (a dataset of unknown length and no `steps_per_epoch`); the
length each worker's input has is reported, and the launcher compares them.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import sys
import threading
from types import ModuleType

from . import guards

_MARK = "_mgpu_keeps_position"
# The phases, as the launcher reads them (launcher/job/detect/lockstep.py PHASES).
TRAIN, EVALUATE, PREDICT, SAVE, OUTSIDE = "train", "evaluate", "predict", "save", "outside"
_METHODS = {"fit": TRAIN, "evaluate": EVALUATE, "predict": PREDICT, "save": SAVE,
            "save_weights": SAVE}

_lock = threading.Lock()
_phases: list[str] = []  # the phases entered and not left, innermost last
_state: dict = {}  # the position's other parts, reported as they are (see fields)


def fields() -> dict:
    """This task's position as progress fields ({} before any Keras call or
    distributed call of a custom loop: runtime/calls.py)."""
    from launcher.runtime import calls

    counted = calls.fields()
    with _lock:
        if not _state and not counted:
            return {}
        return {"at": _phases[-1] if _phases else OUTSIDE, **_state, **counted}


def _changed(**parts) -> None:
    """Update the position and report it now (the step counter read with it)."""
    step = _step()
    with _lock:
        _state.update({k: v for k, v in parts.items() if v is not None})
        for key in [k for k, v in parts.items() if v is None]:
            _state.pop(key, None)
        _state["at_step"] = step if step is not None else _state.get("at_step", 0)
    from launcher import runtime

    runtime.write_progress({})


def _step() -> int | None:
    from launcher.runtime import steps

    try:
        return steps.current_step()
    except Exception:  # noqa: BLE001 - a counter being replaced: the position goes without
        return None


def enter(phase: str) -> None:
    with _lock:
        _phases.append(phase)
    _changed()


def leave() -> None:
    with _lock:
        if _phases:
            _phases.pop()
    _changed()


def _input_length(args: tuple, kwargs: dict) -> tuple[int | None, str]:
    """The steps of one epoch of `fit` as this worker will run them, and from what."""
    given = kwargs.get("steps_per_epoch")
    if isinstance(given, int) and given > 0:
        return given, "steps_per_epoch"
    data = args[0] if args else kwargs.get("x")
    cardinality = getattr(data, "cardinality", None)
    if cardinality is None:
        return None, ""
    try:
        length = int(cardinality())
    except Exception:  # noqa: BLE001 - not a tf.data dataset after all
        return None, ""
    if length == -2 and given is None and _several_workers():  # tf.data.UNKNOWN_CARDINALITY
        _warn_once("mgpu-launch: warning: fit() got a dataset of unknown length and no "
                   "steps_per_epoch: every worker must run the same number of steps, or "
                   "the one whose input ends first leaves the epoch while the others wait "
                   "in its next all-reduce — repeat() the dataset and set steps_per_epoch")
    return (length, "input") if length > 0 else (None, "")


def _several_workers() -> bool:
    from launcher.runtime import guards

    return guards.several_workers()


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr, flush=True)


def _epoch_callback(callbacks_module: ModuleType):
    """A Keras callback (of the script's Keras) that keeps the epoch: begin and end only."""

    class EpochPosition(callbacks_module.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            _changed(at_epoch=int(epoch), at_from=_step() or 0)

        def on_epoch_end(self, epoch, logs=None):
            began = _state.get("at_from", 0)
            _changed(at_ended=[int(epoch), max(0, (_step() or 0) - began)])

    return EpochPosition


def keep_phase(cls: type, name: str, phase: str, callbacks_module: ModuleType | None) -> None:
    """Wrap `cls.<name>` so that its call is the phase `phase` (once)."""
    original = getattr(cls, name, None)  # Keras 3's fit is its backend trainer's
    if original is None or getattr(original, _MARK, False):
        return
    epoch = _epoch_callback(callbacks_module) if callbacks_module is not None else None

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if epoch is not None:  # fit
            length, by = _input_length(args, kwargs)
            epochs = kwargs.get("epochs", args[3] if len(args) > 3 else 1)
            with _lock:
                _state["at_len"], _state["at_len_by"] = length or 0, by  # 0: unknown
                _state["at_epochs"] = epochs if isinstance(epochs, int) else 0
                _state.pop("at_stopping", None)
            if len(args) <= 5:  # callbacks is fit's 6th parameter: given by name or not at all
                # First: an epoch's end is marked before the script's callbacks run
                # (a slow chief-only one there is not a worker stuck in a step).
                kwargs["callbacks"] = [epoch(), *(kwargs.get("callbacks") or [])]
        if phase == SAVE:
            guards.hold_sigterm()  # a stop now waits for the save's end
        enter(phase)
        try:
            result = original(self, *args, **kwargs)
        except BaseException:
            # Raised (a collective aborted, most often): the position stays where
            # it was, the last place its peers saw; whether a callback had asked
            # to stop training (a stopping rule that differs between workers).
            if epoch is not None and getattr(self, "stop_training", False):
                with _lock:
                    _state["at_stopping"] = 1
            raise
        finally:
            if phase == SAVE:
                guards.release_sigterm()
        leave()
        return result

    setattr(method, _MARK, True)
    setattr(cls, name, method)


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3, also behind `tf.keras` from TF 2.16) or `tf_keras` imported."""
    for name, phase in _METHODS.items():
        keep_phase(module.Model, name, phase, module.callbacks if name == "fit" else None)


def on_tensorflow(module: ModuleType) -> None:
    """A custom loop's checkpoints: saving too."""
    for name in ("save", "write"):
        keep_phase(module.train.Checkpoint, name, SAVE, None)
    keep_phase(module.train.CheckpointManager, "save", SAVE, None)


HOOKS = {"keras": on_keras, "tf_keras": on_keras, "tensorflow": on_tensorflow}
