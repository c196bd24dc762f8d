"""Steps from any script, zero code: the step count read from the optimizer.

Every Keras `fit` and every custom training loop that calls
`optimizer.apply_gradients` counts its steps in the optimizer's `iterations`
variable: from the start of training, not per epoch, and restored with the
optimizer by BackupAndRestore or a `tf.train.Checkpoint`. So the launcher can
show steps and steps/s for a script that never calls the runtime (TensorFlow's
multi-worker tutorials as they are):

- a post-import hook on `keras` and `tf_keras` wraps the optimizer base
  classes' `__init__` (Keras 3's `Optimizer`, tf_keras' `Optimizer` and legacy
  `OptimizerV2`) to remember each optimizer built, by weak reference;
- one daemon thread, started with the first optimizer, reads their step
  counters every `MGPU_STEPS_EVERY_S` seconds (default 2; `0` turns this off)
  and reports the highest as progress when it changed, through the channel of
  `runtime.report_progress`. Nothing runs inside the training step: the cost
  is one variable read every two seconds, and one more at a clean exit (the
  last steps of a short run).

`fit` also gets one more callback, called at each epoch's start and end only,
that keeps the epoch's loss as Keras logged it (already reduced across
workers): the next report carries it; and, last of the callbacks, tells where a
restarted `fit` resumed (runtime.restores). A custom loop's loss is the
script's to report.

A script that reports steps itself (`runtime.callbacks()`,
`report_progress(step)`) wins: after its first step report this module stays
silent for the rest of the process, so the two never disagree on a step.

Only an existing counter is read: a legacy optimizer creates `iterations` on
first use, inside the script's strategy scope, and reading it earlier from
another thread would create it outside that scope. Keras 3 on JAX keeps the
counter out of the optimizer during an epoch of `fit` (in the trainer's state,
passed from step to step, written back at the epoch's end): the `fit` wrapper
remembers the model, by weak reference, and the thread reads the counter from
that state while it is unsynced, so there too the steps advance as they are
trained, counted from the state's start (the restored optimizer's counter).

Graph mode (tf_keras or Keras 2 `fit` after `disable_eager_execution`, in the
session set with `K.set_session`: the seed's TF1 `tf.train.Server` shape): a
counter is a graph variable (often on a ps, shared by every worker: the global
step), read only with that session, and the session is the training thread's.
There `fit`'s added callback reads it with Keras' own `get_value` at most once
every `MGPU_STEPS_EVERY_S` seconds at a batch's end and once at each epoch's
end (a read of one integer, never one per step), and a save or a restore in
that thread reads it at once (`step_of`). A TF1 optimizer Keras wrapped
(`TFOptimizer`) counts in its `iterations`.

Standard library only at import time; Keras is reached only through the
modules the hooks receive. Must not import the launcher side.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

EVERY_S_DEFAULT = 2.0
_MARK = "_mgpu_counts_steps"

_lock = threading.Lock()
_optimizers: list[weakref.ref] = []
_trainers: list[weakref.ref] = []  # Keras 3 models whose `fit` ran on JAX
_watcher: threading.Thread | None = None
_stop = threading.Event()  # set at exit: the watcher reads no more
_last_reported: int | None = None
_epoch_loss: float | None = None  # the last epoch's loss as Keras logged it
_loss_reported: float | None = None  # the epoch loss the last report carried
_graph_step: int | None = None  # the last graph-mode read (the training thread's)
_graph_thread: int | None = None  # the thread that runs a graph-mode `fit`
_graph_model: weakref.ref | None = None  # ... and its model


def _no_saves() -> bool:
    return False


def _nobody(model, epoch: int) -> None:
    return None


# What else the counter's reports and `fit`'s first epoch concern, wired by the
# bootstrap that installs the hooks (launcher/bootstrap.py): checkpoint saves
# timed since the last report (runtime.saves.pending), and where a restarted
# `fit` resumed (runtime.restores.first_epoch). They sit above this module and
# read its counters: wired, not imported, so the imports go one way.
saves_pending: Callable[[], bool] = _no_saves
first_epoch: Callable[[Any, int], None] = _nobody


def every_s() -> float:
    """Seconds between two reads (0: off), from MGPU_STEPS_EVERY_S."""
    raw = os.environ.get("MGPU_STEPS_EVERY_S", "").strip()
    try:
        value = float(raw) if raw else EVERY_S_DEFAULT
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        _warn_once(f"mgpu-launch: MGPU_STEPS_EVERY_S={raw!r} is not a number of seconds "
                   f"(0 turns step counting off); counting every {EVERY_S_DEFAULT:g} s")
        return EVERY_S_DEFAULT
    return value


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """To the task's stderr (its log, prefixed by the launcher), once per process."""
    if message not in _warned:
        _warned.add(message)
        print(message, file=sys.stderr, flush=True)


def enabled() -> bool:
    """Counting is on in a task of the launcher (it has a progress channel)."""
    return bool(os.environ.get("MGPU_PROGRESS_FD")) and every_s() > 0


def track(optimizer) -> None:
    """Remember `optimizer`; start the watcher with the first one."""
    global _watcher
    with _lock:
        _optimizers[:] = [ref for ref in _optimizers if ref() is not None]
        _optimizers.append(weakref.ref(optimizer))
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, args=(every_s(),),
                                        name="mgpu-steps", daemon=True)
            _watcher.start()
            atexit.register(_at_exit)  # the last steps of a short run, at a clean exit


def current_step() -> int | None:
    """The highest step counter among the live optimizers (None: none yet)."""
    with _lock:
        optimizers = [ref() for ref in _optimizers]
        trainers = [ref() for ref in _trainers]
    steps = [step for step in map(read_iterations, optimizers) if step is not None]
    steps += [step for step in map(read_jax_state, trainers) if step is not None]
    if _graph_step is not None:
        steps.append(_graph_step)
    return max(steps) if steps else None


def counter_of(optimizer) -> Any:
    """An optimizer's step counter if it exists (never creates it): Keras'
    `_iterations`, or the `iterations` a `TFOptimizer` (a TF1 optimizer Keras
    wrapped) holds as a plain attribute."""
    if optimizer is None:
        return None
    counter = getattr(optimizer, "_iterations", None)
    if counter is None:
        counter = getattr(optimizer, "__dict__", {}).get("iterations")
    return counter


def read_iterations(optimizer) -> int | None:
    """An optimizer's step counter if it already exists (never creates it);
    None for a graph-mode counter (`graph_step` reads those)."""
    counter = counter_of(optimizer)
    if counter is None:
        return None
    try:
        value = counter.numpy() if hasattr(counter, "numpy") else counter
        return int(value)
    except Exception:  # noqa: BLE001 - a counter being replaced, a backend quirk: skip
        return None


def read_jax_state(model) -> int | None:
    """The step counter in a Keras 3 JAX trainer's state during `fit` (None:
    no unsynced state now, then the optimizer's own variable holds it).

    JAX's `fit` takes the optimizer's variables out of the optimizer at each
    epoch's start and passes them from step to step in `model._jax_state`;
    the counter is at the index of `optimizer.iterations` in
    `optimizer.variables`. Reading it waits (in this thread) for the step that
    computes it; a state the next step already consumed (donated) raises, and
    the next state is read instead.
    """
    if model is None:
        return None
    for _ in range(3):
        try:
            state = model._jax_state
            if model._jax_state_synced or not isinstance(state, dict):
                return None
            values = state.get("optimizer_variables")
            if not values:
                return None  # evaluate's or predict's state: no optimizer in it
            optimizer = model.optimizer
            counter = optimizer.iterations
            index = next(i for i, v in enumerate(optimizer.variables) if v is counter)
            value = values[index]
            # Under a multi-process distribution the array spans every process's
            # devices: this process reads its own copy (replicated).
            shards = getattr(value, "addressable_shards", None)
            return int(shards[0].data if shards else value)
        except Exception:  # noqa: BLE001 - consumed by the next step, fit ending: again
            continue
    return None


def track_trainer(model) -> None:
    """Remember a Keras 3 model whose `fit` runs on JAX (once, by weak reference)."""
    if not hasattr(model, "jax_state_sync"):
        return  # not the JAX trainer: the optimizer's variable is always current
    with _lock:
        _trainers[:] = [ref for ref in _trainers if ref() is not None and ref() is not model]
        _trainers.append(weakref.ref(model))


def _watch(period_s: float) -> None:
    from .threadname import name_this_thread

    name_this_thread("mgpu-steps")
    while not _stop.wait(period_s):
        if not report_step():
            return  # the script counts its own steps: its numbers stand


def _at_exit() -> None:
    """The last read, after the watcher's: a daemon thread still inside a
    backend's call (a JAX read waiting with the GIL released) when the
    interpreter finalizes could abort the process. Waits for it 1 s at most."""
    _stop.set()
    watcher = _watcher
    if isinstance(watcher, threading.Thread) and watcher is not threading.current_thread():
        watcher.join(timeout=1.0)
    report_step()


def report_step() -> bool:
    """Report the step counter if it moved; False once the script reports its own."""
    global _last_reported, _loss_reported
    from launcher import runtime  # loaded already: this module is part of it
    from launcher.runtime import calls

    if runtime.steps_reported_by_script():
        return False
    step = current_step()
    # A distributed call begun since (runtime/calls.py): where a stuck worker waits.
    # An epoch's loss new since: the epoch's end said even when the watcher read its
    # last step first (a save's report at that step, after it, carries no loss).
    moved = step != _last_reported or saves_pending() or calls.unsent() \
        or _epoch_loss != _loss_reported
    if step is not None and step > 0 and moved:
        _last_reported, _loss_reported = step, _epoch_loss
        # `counted`: read off the optimizer, not reported by the script. Where a
        # restarted generation resumed is not this (it is read seconds into
        # training): the launcher takes resume points from the script's reports.
        record: dict = {"step": step, "time": time.time(), "counted": 1}
        if _epoch_loss is not None:
            record["loss"] = _epoch_loss
        runtime.write_progress(record)
    return True


def _epoch_end_callback(callbacks_module: ModuleType):
    """A Keras callback (of the script's Keras) that keeps each epoch's loss."""

    class EpochLoss(callbacks_module.Callback):
        # Epoch ends only: a batch hook would make Keras hand over every
        # step's logs, and logs at an epoch's end are already reduced.
        began = False

        def on_epoch_begin(self, epoch, logs=None):
            if not self.began:  # after every callback's restore: where fit resumed
                self.began = True
                first_epoch(self.model, epoch)

        def on_epoch_end(self, epoch, logs=None):
            global _epoch_loss
            try:
                _epoch_loss = float((logs or {})["loss"])
            except (KeyError, TypeError, ValueError):
                return
            report_step()

    return EpochLoss


def _graph_callback(epoch_loss: type, period_s: float):
    """The epoch-loss callback for a graph-mode `fit`: it also reads the step
    counter with the model's session, at most once every `period_s` at a
    batch's end, and at each epoch's end and at the end of training."""

    class GraphSteps(epoch_loss):
        due = 0.0

        def on_train_batch_end(self, batch, logs=None):
            now = time.monotonic()
            if now >= self.due:
                self.due = now + period_s
                graph_step(self.model)
                report_step()

        def on_epoch_end(self, epoch, logs=None):
            graph_step(self.model)
            super().on_epoch_end(epoch, logs)

        def on_train_end(self, logs=None):
            graph_step(self.model)
            report_step()

    return GraphSteps


def _graph_mode() -> bool:
    """TensorFlow runs graphs in a session here (`disable_eager_execution`)."""
    tf = sys.modules.get("tensorflow")
    try:
        return tf is not None and not tf.executing_eagerly()
    except Exception:  # noqa: BLE001 - a TensorFlow half loaded: not ours to judge
        return False


def graph_step(model) -> int | None:
    """The step counter of a graph-mode Keras model, read with its Keras
    session (`backend.get_value`), in the thread that runs its `fit` only: the
    session set with `K.set_session` is that thread's. None elsewhere, or when
    it has none (kept: `current_step` returns the last one read)."""
    global _graph_step
    if _graph_thread != threading.get_ident() or model is None:
        return None
    counter = counter_of(getattr(model, "optimizer", None))
    backend = getattr(sys.modules.get(type(model).__module__.partition(".")[0]), "backend", None)
    if counter is None or backend is None:
        return None
    try:
        step = int(backend.get_value(counter))
    except Exception:  # noqa: BLE001 - a session closing, a layout we do not know: no read
        return None
    with _lock:
        _graph_step = step
    return step


def graph_now() -> int | None:
    """The step counter of the model of a graph-mode `fit`, read now (in its
    thread; a `Saver` of the script's own saves without a model): else None."""
    model = _graph_model() if _graph_model is not None else None
    return graph_step(model) if model is not None else None


def count_loss_of(model_class, callbacks_module: ModuleType, *more: type) -> None:
    """Wrap `model_class.fit` (and each of `more`'s, graph mode's `Model` that
    has a `fit` of its own) to add the epoch-loss callback (once); in graph
    mode, the one that also reads the step counter."""
    epoch_loss = _epoch_end_callback(callbacks_module)
    period_s = every_s()
    graph_steps = _graph_callback(epoch_loss, period_s) if period_s > 0 else epoch_loss
    for cls in (model_class, *more):
        _wrap_fit(cls, epoch_loss, graph_steps)


def _wrap_fit(model_class: type, epoch_loss: type, graph_steps: type) -> None:
    original = getattr(model_class, "fit", None)  # Keras 3's is its trainer's
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        global _graph_thread, _graph_model
        track_trainer(self)
        graph = _graph_mode()
        if graph:
            _graph_thread, _graph_model = threading.get_ident(), weakref.ref(self)
        given = kwargs.get("callbacks") or []
        # callbacks is fit's 6th parameter: given by name or not at all (and
        # added once: graph mode's fit may call the other).
        if len(args) <= 5 and not any(isinstance(c, epoch_loss) for c in given):
            kwargs["callbacks"] = [*given, graph_steps() if graph else epoch_loss()]
        return original(self, *args, **kwargs)

    setattr(fit, _MARK, True)
    model_class.fit = fit


def count_steps_of(cls) -> None:
    """Wrap `cls.__init__` so that every optimizer built is tracked (once)."""
    original = cls.__init__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        track(self)

    setattr(__init__, _MARK, True)
    cls.__init__ = __init__


def _optimizer_bases(module: ModuleType) -> list[type]:
    optimizers = module.optimizers  # an AttributeError names what moved (hooks.py warns)
    bases = [optimizers.Optimizer]
    legacy = getattr(optimizers, "legacy", None)  # tf_keras' OptimizerV2
    if legacy is not None and getattr(legacy, "Optimizer", None) is not None:
        bases.append(legacy.Optimizer)
    return bases


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3, also behind `tf.keras` from TF 2.16) or `tf_keras` imported."""
    for base in _optimizer_bases(module):
        count_steps_of(base)
    count_loss_of(module.Model, module.callbacks, *_graph_models(module))


def _graph_models(module: ModuleType) -> list[type]:
    """tf_keras' (and Keras 2's) graph-mode `Model` (`training_v1`): its own `fit`."""
    for name in (f"{module.__name__}.src.engine.training_v1",
                 f"{module.__name__}.engine.training_v1"):
        model = getattr(sys.modules.get(name), "Model", None)
        if isinstance(model, type):
            return [model]
    return []


HOOKS = {"keras": on_keras, "tf_keras": on_keras}


def step_of(model) -> int | None:
    """The step count at a save: the saving model's optimizer, else the highest
    counter the step watcher tracks (a save's step, a restore's: runtime.saves, restores)."""
    if model is not None:
        step = read_jax_state(model)
        if step is None:
            step = read_iterations(getattr(model, "optimizer", None))
        if step is None:
            step = graph_step(model)
        if step is not None:
            return step
    return current_step()
