"""The NaN sentinel, zero code: a loss that goes bad seen at the step, and no
save of non-finite weights reported as progress (issue 52).

A batch of garbage (a 1e30, a division by zero) makes one step's loss inf or
NaN; under MultiWorkerMirroredStrategy its gradient reaches every worker's
weights at the all-reduce, and every later epoch trains NaN, saves NaN
backups and ends "succeeded". So, in each task of the launcher:

- Keras `fit` (tf_keras and Keras 3): a post-import hook wraps `Model.fit` to
  add one callback, first of them, that reads the loss Keras logs at each
  step's end. The logs hold the epoch's running mean m_k: the step's own loss
  is k·m_k − (k−1)·m_{k−1}, so the first non-finite mean of an epoch names the
  step that went bad (the mean stays bad from there on). It is reported at
  once to the launcher (`nonfinite`: [the optimizer's step, the epoch, the
  batch], epoch and batch as Keras' callbacks number them, from 0;
  `nonfinite_loss`: the mean, "nan" or "inf"; `nonfinite_exact: 1` where the
  launcher may skip that batch by its position, else `nonfinite_inexact`: why
  not, runtime/epochinput.py and epochinput3.py), once per process, within one step. Keras logs
  the mean already reduced across the workers (its metrics are read across
  replicas): every worker of a MultiWorkerMirroredStrategy
  job sees the bad step at once, whichever worker's batch it was.
  The read costs no wait on the device: tf_keras hands the callback the
  step's tensors (`_supports_tf_logs`) and the callback reads step k's mean
  at step k+1's end (or at the epoch's end, before any callback saves), when
  step k is done; Keras 3 hands it plain numbers, off the training thread
  where it dispatches callbacks so (`async_safe`).
- every save the bootstrap reports (runtime/saves.py) is first checked: a
  Keras saver's model's trainable weights, a `tf.train.Checkpoint`'s
  variables, all finite (one numpy read of each; docs/benchmarks.md, "The
  NaN sentinel"). A save of non-finite weights is reported as such
  (`saved_nonfinite`), never as a save: it is no progress and no resume point;
  a Keras callback's or a `CheckpointManager`'s is not made at all, so the
  directory's newest save stays the last good one (runtime/saves.py).

The launcher stops a generation whose loss went bad and restarts it from
that last good save (launcher/job/detect/sentinel.py); when the same step
goes bad again and the report said the skip is exact, every later
generation skips that step's batch (runtime/epochinput.py; Keras 3 on
TensorFlow: runtime/epochinput3.py).

The same step losses feed the spike test (runtime/spikes.py): a finite loss
far above its recent window is reported (`loss_spike`, with its loss, the
window's median and the z-score); with `sentinel: {on_spike: rollback}`
(MGPU_ON_SPIKE=rollback) it also spoils the weights as a NaN does: no later
save is made and the backup is kept, for the launcher's rollback.

The drill's NaN (`mgpu-launch drill --nan`, launcher/commands/drill_faults.py)
reaches a task as a request (runtime/trace.py's watcher): at its next step the
loss callback makes one weight of the model NaN, as a flipped bit on a bad
device would; the all-reduce spreads it to every worker at that step, and the
sentinel must see it, the launcher roll back and the replay pass the step.

`sentinel: off` in the cluster file (MGPU_SENTINEL=off) turns both off.
A custom loop's loss is the script's: `runtime.report_progress(step, loss=...)`.

Standard library only at import time; Keras and TensorFlow are reached
through the modules the hooks receive and the objects they hand over. Must
not import the launcher side.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import threading
import time
from types import ModuleType
from typing import Any

from . import steps  # loaded with this module (the same hooks: bootstrap.WATCHED)
from .epochinput import skip_blocker, skipped_in  # standard library only at import

_MARK = "_mgpu_watches_loss"
ENV = "MGPU_SENTINEL"
# `sentinel: {on_spike, spike_z, spike_window}` (runtime/spikes.py): report | rollback | off.
SPIKE_ENV, SPIKE_Z_ENV, SPIKE_WINDOW_ENV = "MGPU_ON_SPIKE", "MGPU_SPIKE_Z", "MGPU_SPIKE_WINDOW"
_OFF = frozenset({"off", "0", "false", "no"})
MAX_SPIKES = 20  # reported by one process at most
# How long `fit` holds its spoiled weights back from the script, waiting for
# the launcher to stop the generation (it does so at the report, in seconds).
HOLD_S = 120.0

_lock = threading.Lock()
_told = False  # this process reported its non-finite loss already
_spoiled = False  # its loss went non-finite, or spiked with `on_spike: rollback`
_spoiled_at: int | None = None  # the step it went bad at, as reported
# Its weights went non-finite with the loss finite or unwatched (a refused save
# the launcher rolls back), at that save's step (None: not read). Held back from
# the script, and its backup kept, as a bad loss's are.
_weights_bad = False
_weights_bad_at: int | None = None
_active: list[Any] = []  # the loss callbacks of the `fit` calls running
_fits = 0  # `fit` calls running, watched or not
_spikes_told = 0
_poison = threading.Event()  # the drill's NaN: spoil a weight at the next step


def enabled() -> bool:
    """On in a task of the launcher unless `sentinel: off` (MGPU_SENTINEL)."""
    return bool(os.environ.get("MGPU_PROGRESS_FD")) and \
        os.environ.get(ENV, "").strip().lower() not in _OFF


def _number(value: Any) -> float | None:
    """A logged value as a float (a tensor is read here: one scalar)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def on_spike() -> str:
    """What a loss spike does here: `report` (the default), `rollback` or `off`."""
    said = os.environ.get(SPIKE_ENV, "").strip().lower()
    return said if said in ("rollback", "off") else "report"


def spike_watch() -> Any:
    """A fresh window of step losses (runtime/spikes.py), or None: spikes not watched."""
    if on_spike() == "off":
        return None
    from . import spikes

    def knob(name: str, default: float) -> float:
        try:
            return float(os.environ.get(name) or default)
        except ValueError:
            return default

    return spikes.SpikeWatch(window=max(8, int(knob(SPIKE_WINDOW_ENV, spikes.WINDOW))),
                             z=knob(SPIKE_Z_ENV, spikes.Z))


def exactness(model: Any) -> dict[str, Any]:
    """Whether the launcher may skip the bad step's batch by its position
    (runtime/epochinput.py: tf_keras, or Keras 3 on TensorFlow, a carried
    input, one batch a step):
    `nonfinite_exact: 1`, or `nonfinite_inexact`: why not."""
    try:
        why = skip_blocker(model)
    except Exception as exc:  # noqa: BLE001 - a model of a shape not known here
        why = f"its steps per execution cannot be read ({type(exc).__name__})"
    return {"nonfinite_inexact": why[:200]} if why else {"nonfinite_exact": 1}


def report(step: int | None, epoch: int, batch: int, loss: float, model: Any = None) -> None:
    """The first non-finite loss of this process, to the launcher at once
    (with `exactness` of `model`, the model `fit` trains)."""
    global _told, _spoiled, _spoiled_at
    with _lock:
        if _told:
            return
        _told = _spoiled = True
        _spoiled_at = step
    from launcher import runtime

    # A short list of integers, as a progress value must be (launcher/job/run/protocol.py).
    runtime.write_progress({"nonfinite": [-1 if step is None else int(step), int(epoch),
                                          int(batch)], "nonfinite_loss": str(loss),
                            **exactness(model), "time": time.time()})


def report_spike(step: int, epoch: int, batch: int, spike: Any, model: Any = None) -> None:
    """A loss spike (runtime/spikes.py), to the launcher at once; with
    `on_spike: rollback` the weights are spoiled from here on, as a NaN's are:
    no later save is made (`save_is_finite`), the backup is kept (and the
    launcher told the `exactness` of `model`)."""
    global _spoiled, _spoiled_at, _spikes_told
    rollback = on_spike() == "rollback"
    with _lock:
        if _spikes_told >= MAX_SPIKES or (_spoiled and rollback):
            return
        _spikes_told += 1
        if rollback and not _spoiled:
            _spoiled, _spoiled_at = True, step
    from launcher import runtime

    runtime.write_progress({"loss_spike": [int(step), int(epoch), int(batch)],
                            "loss_spike_loss": float(spike.loss),
                            "loss_spike_median": float(spike.median),
                            "loss_spike_z": min(float(spike.z), 1e9),  # inf: a flat window
                            **({"loss_spike_rollback": 1, **exactness(model)} if rollback
                               else {}),
                            "time": time.time()})


def step_loss(before: tuple[int, float], count: int, mean: float) -> float:
    """The steps' own loss since the mean last read, (count steps, their mean)
    then: k·m_k − j·m_j over k − j steps (one, unless Keras logs every few)."""
    return (count * mean - before[0] * before[1]) / (count - before[0])


class _LossReads:
    """The loss sentinel's reads of a logged mean (its state is the callback's,
    `_loss_callback`): a non-finite one reported, a finite one a spike's sample."""

    def _check(self, batch: int, mean: Any) -> None:
        value = _number(mean)
        if value is None:
            return
        first = self._first if self._first is not None else 0
        if not math.isfinite(value):
            report(self._start + batch - first + 1, self._epoch, batch, value, self.model)
        elif self._spikes is not None:
            self._spike(batch, batch - first + 1, value)

    def _spike(self, batch: int, ran: int, mean: float) -> None:  # ran: skipped ones too
        with self._seen:  # Keras 3 may call back out of order: an older mean is passed
            # The mean is of the batches trained, not those skipped (runtime/epochinput.py).
            count = ran - skipped_in(self.model, self._epoch, self._first or 0, batch)
            before, self._read = self._read, max(self._read, (count, mean))
            spike = self._spikes.add(step_loss(before, count, mean)) \
                if count > before[0] else None
            epoch, step = self._epoch, self._start + ran
        if spike is not None:
            report_spike(step, epoch, batch, spike, self.model)


def _off_thread_safe() -> bool:
    """Whether Keras 3 may run the loss callback off the training thread: on
    TensorFlow only. On JAX that raced the next step's donated buffers (a
    `fit` with no other batch callback failed at its second step: "Buffer has
    been deleted or donated")."""
    keras = sys.modules.get("keras")
    try:
        return keras is not None and keras.backend.backend() == "tensorflow"
    except Exception:  # noqa: BLE001 - a Keras without backends (Keras 2): not asked
        return False


def _loss_callback(callbacks_module: ModuleType):
    """A Keras callback (of the script's Keras) that watches each step's loss."""

    class LossSentinel(_LossReads, callbacks_module.Callback):
        _supports_tf_logs = True  # tf_keras: the step's tensors, read a step later
        async_safe = _off_thread_safe()  # Keras 3 on TensorFlow: may run off its thread

        def __init__(self) -> None:
            super().__init__()
            self._epoch, self._start, self._first = 0, 0, None
            self._held: tuple[int, Any] | None = None  # (batch, its logged mean) not read yet
            self._seen = threading.Lock()
            self._spikes = spike_watch()  # step losses across epochs (None: not watched)
            self._read = (0, 0.0)  # (steps of this epoch, their mean) last read

        def on_epoch_begin(self, epoch, logs=None):
            with self._seen:
                self._epoch, self._first, self._held, self._read = int(epoch), None, None, (0, 0.)
                self._start = steps.step_of(self.model) or 0

        def on_train_batch_begin(self, batch, logs=None):
            _spoil_if_asked(self.model)  # the drill's NaN
            if self._first is None:  # where this epoch began (a resume may start mid-epoch)
                self._first = int(batch)  # and a skip before it moved the step since read:
                self._start += skipped_in(self.model, self._epoch, 0, self._first - 1)

        def on_train_batch_end(self, batch, logs=None):
            with self._seen:
                held, self._held = self._held, (int(batch), (logs or {}).get("loss"))
            if held is not None:
                self._check(*held)

        def on_epoch_end(self, epoch, logs=None):  # first of the callbacks: before a save
            self.settle()

        def settle(self) -> None:
            """Read the loss held since the last batch's end now (a save checks
            its weights: a bad loss at its step is told first)."""
            with self._seen:
                held, self._held = self._held, None
            if held is not None:
                self._check(*held)

    return LossSentinel


def poison_next_step() -> None:
    """The drill's NaN fault: one weight of the model `fit` trains here made
    NaN at its next step (nothing happens where no `fit` is watched)."""
    _poison.set()


def _spoil_if_asked(model: Any) -> None:
    """The drill's NaN, if asked: spoiled, and said (`drill_nan`: the step)."""
    if _poison.is_set():
        _poison.clear()
        spoil_one_weight(model)
        from launcher import runtime

        runtime.write_progress({"drill_nan": steps.step_of(model) or 0, "time": time.time()})


def spoil_one_weight(model: Any) -> None:
    """The last floating-point trainable weight of `model` (most often the
    output layer's bias), all NaN. Not the first: a NaN kernel before a ReLU
    can vanish without a trace, since TensorFlow's fused MatMul+ReLU on some
    CPUs (oneDNN) maps NaN to 0 and its gradient to 0, so the loss stays
    finite while that worker's weights stay NaN, and the drill would test
    nothing the sentinel can see; the output's weights reach the loss."""
    import numpy as np

    for weight in reversed(getattr(model, "trainable_weights", None) or []):
        value = np.asarray(weight.numpy())
        if value.dtype.kind == "f":
            weight.assign(np.full(value.shape, np.nan, value.dtype))
            return


def watch_loss_of(model_class, callbacks_module: ModuleType) -> None:
    """Wrap `model_class.fit` to add the loss sentinel, first of its callbacks (once)."""
    original = model_class.fit
    if getattr(original, _MARK, False):
        return
    sentinel = _loss_callback(callbacks_module)

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        # callbacks is fit's 6th parameter: given by name or not at all. Under
        # ParameterServerStrategy fit refuses batch-level callbacks: not watched.
        global _fits
        watch = sentinel() if len(args) <= 5 and not _parameter_server(self) else None
        if watch is not None:
            kwargs["callbacks"] = [watch, *(kwargs.get("callbacks") or [])]
        with _lock:
            _active.extend([watch] if watch is not None else [])
            _fits += 1
        try:
            history = original(self, *args, **kwargs)
        finally:
            with _lock:
                _fits -= 1
                if watch is not None:
                    _active.remove(watch)
        hold_spoiled_weights()
        return history

    setattr(fit, _MARK, True)
    model_class.fit = fit


def hold_spoiled_weights(hold_s: float | None = None) -> None:
    """`fit` returned after this process's loss went bad: its weights are
    spoiled. A bad step near the end of `fit` reaches that end before the
    launcher's stop lands, and the script's code after `fit` (a final
    `model.save`, an export, an evaluation, a print of results) must not run on
    NaN weights in a generation the launcher rolls back. So the task waits for
    that stop; past `hold_s` (HOLD_S) with none, it raises instead of returning."""
    if _spoiled:
        what = "the loss went bad" + ("" if _spoiled_at is None else f" at step {_spoiled_at}")
    elif _weights_bad:
        what = "its weights went non-finite (" + ("a save" if _weights_bad_at is None else
                                                 f"its save of step {_weights_bad_at}") + \
            " refused)"
    else:
        return
    hold_s = HOLD_S if hold_s is None else hold_s
    print(f"mgpu-launch: fit() ended after {what}: its weights are not handed back to the "
          "script; waiting for the launcher to roll back", file=sys.stderr, flush=True)
    threading.Event().wait(hold_s)  # the launcher's stop (a signal) ends the wait
    raise RuntimeError(f"mgpu-launch: {what} and the launcher did not stop this task within "
                       f"{hold_s:.0f} s; fit()'s weights are not finite")


def _parameter_server(model: Any) -> bool:
    try:
        strategy = model.distribute_strategy
    except Exception:  # noqa: BLE001 - no strategy known: the default one
        return False
    return "ParameterServer" in type(strategy).__name__


def keep_backup_after_bad_loss(backup_class) -> None:
    """`BackupAndRestore` deletes its backup when `fit` ends (both Kerases). A
    loss gone bad near the end of `fit` can reach that end before the launcher
    stops the generation: the backup, the last save before the bad step and the
    restart's resume point, would be gone and the restart would train from
    scratch. Once this process's loss went bad, the deletion is skipped."""
    from .hooks import wrap_method

    def make(original):
        def on_train_end(self, *args, **kwargs):
            if _spoiled or _weights_bad:
                return None
            return original(self, *args, **kwargs)
        return on_train_end

    wrap_method(backup_class, "on_train_end", make, _MARK)


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3, also behind `tf.keras` from TF 2.16) or `tf_keras` imported."""
    if enabled():
        watch_loss_of(module.Model, module.callbacks)
        backup = getattr(module.callbacks, "BackupAndRestore", None)
        if backup is not None:
            keep_backup_after_bad_loss(backup)


HOOKS = {"keras": on_keras, "tf_keras": on_keras}


# ------------------------------------------------------------- saved weights


def saved_variables(saver: object) -> list[Any]:
    """The variables a save writes that the check reads: a Keras saver's model's
    weights, trainable or not (a BatchNormalization's moving statistics go NaN
    too), a `tf.train.Checkpoint`'s (or its manager's) objects' (a Keras
    model's or layer's weights; else their trainable variables: an
    optimizer's slots are not read), one level down ([] when none can be found)."""
    model = getattr(saver, "model", None)
    if model is not None:
        return list(getattr(model, "weights", None) or [])
    checkpoint = getattr(saver, "_checkpoint", saver)  # a CheckpointManager's
    children = getattr(checkpoint, "_trackable_children", None)
    if children is None:
        return []
    found: list[Any] = []
    for child in children().values():
        if hasattr(child, "numpy") and hasattr(child, "dtype"):  # a variable itself
            found.append(child)
            continue
        names = ("weights",) if hasattr(child, "trainable_weights") else ()
        for name in (*names, "trainable_weights", "trainable_variables"):
            values = getattr(child, name, None)
            if values and not callable(values):
                found.extend(values)
                break
    return found


def not_finite(value: Any, nan_only: bool = False, min_rank: int = 0) -> str:
    """What is not finite in an array: "NaN", "an infinity" (unless `nan_only`),
    else "" (and "" for an array of fewer than `min_rank` dimensions)."""
    import numpy as np

    array = np.asarray(value)
    if array.ndim < min_rank:
        return ""
    if array.dtype.kind not in "fc":
        if array.dtype.name != "bfloat16":
            return ""
        array = array.astype(np.float32)
    if np.isnan(array).any():
        return "NaN"
    return "" if nan_only or not np.isinf(array).any() else "an infinity"


def all_finite(variables: list[Any]) -> bool:
    """No NaN or infinity in a trainable weight (none is ever right there); no
    NaN in a scalar or another variable (a BatchNormalization's moving
    statistics), where an infinity may be a start: a `best = tf.Variable(inf)`,
    a running minimum. Numpy is loaded by then."""
    import numpy as np

    for variable in variables:
        try:
            value = variable.numpy() if hasattr(variable, "numpy") else variable
            nan_only = getattr(variable, "trainable", True) is False or np.ndim(value) == 0
            bad = not_finite(value, nan_only=nan_only)
        except Exception:  # noqa: BLE001 - a variable that cannot be read here: not judged
            continue
        if bad:
            return False
    return True


def loss_at_save(step: int | None, rolled_back: bool) -> str:
    """What the loss says of a save refused for non-finite weights: "" (no
    `fit` runs here: a custom loop's), "unwatched" (a `fit` whose loss is not
    read: its callbacks given by position, ParameterServerStrategy), "bad" (it
    went bad or spiked: its report, told first, decides) or "finite" (weights
    gone bad that the loss does not show: a BatchNormalization's moving
    statistics, a NaN a fused ReLU hides). The loss of the save's own step is
    read a step late: read now. Where the launcher rolls that save back
    (`rolled_back`: skipped or set aside; and detect/sentinel.py's `_rolls_back`:
    in a `fit`, the chief's only, whose saves are the job's, since a worker's
    own NaN leaves those good), `fit` keeps its backup and holds its weights
    back from the script, as for a bad loss."""
    global _weights_bad, _weights_bad_at
    with _lock:
        watching, fitting = list(_active), _fits > 0
    for watch in watching:
        try:
            watch.settle()
        except Exception:  # noqa: BLE001, S110 - a loss that cannot be read: the weights say
            pass
    if _spoiled:
        return "bad"
    from launcher import runtime

    if rolled_back and (not fitting or runtime.is_chief()):
        with _lock:
            if not _weights_bad:
                _weights_bad, _weights_bad_at = True, step
    return "finite" if watching else "unwatched" if fitting else ""


def spoiled() -> bool:
    """This process's loss went bad (or spiked, with `on_spike: rollback`): its
    weights are not to be saved from here on, and no save is reported."""
    return _spoiled


def spoiled_by_spike() -> bool:
    """This process's weights were trained past a loss spike that `on_spike:
    rollback` rolls back: its saves are refused though finite."""
    return bool(_spoiled and not _told)


def save_is_finite(saver: object) -> bool:
    """A save's weights all finite (True when off or when none can be read);
    False once a spike spoiled them with `on_spike: rollback` (the restart must
    resume from before it)."""
    if not enabled():
        return True
    if _spoiled and not _told:
        return False
    try:
        return all_finite(saved_variables(saver))
    except Exception:  # noqa: BLE001 - a layout we do not know: the save stands
        return True
