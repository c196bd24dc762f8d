"""Keras 3 `Model.fit` under MultiWorkerMirroredStrategy, made to work (and to refuse).

Upstream Keras 3 (keras-team/keras#20585) breaks in two spots of
`keras/src/backend/tensorflow/trainer.py` when several workers train under
`MultiWorkerMirroredStrategy` (docs/design.md, "Keras on this stack"):

1. `_maybe_symbolic_build` (Keras 3.4+) averages the first distributed batch
   with an eager `strategy.reduce(...)`, which the collective strategy cannot
   do on a `PerReplica` batch. Building needs only shapes and dtypes: one local
   replica's batch is enough, and no collective runs.
2. `reduce_per_replica` reduces every logged value with `axis=0`, which fails
   on scalars; a scalar is averaged over the replicas with `axis=None`.
3. Keras 3.3 (`keras/src/backend/tensorflow/optimizer.py`) sums the gradients
   over the replicas inside a merge call, in cross-replica context, where
   there is no replica context to all-reduce in: each worker applies its own
   gradients and the workers' weights drift apart. The sum is done before the
   merge call instead, as Keras 3.4+ does.

Keras 3's `BackupAndRestore` and `ModelCheckpoint` are not multi-worker aware
either: their fixes are runtime/keras_savers.py's, applied by the hooks here.
What every fix needs (the version, the chief, the capability checks, the
refusal) is runtime/keras_patch.py's.

The fixes go by capability, not by version string: each `Fix` checks, when its
module is imported, that the code it patches has the signature it expects and
that the bug it fixes is there (the source still does what is broken). A fix
whose bug is gone is skipped; a fix that cannot apply (a private signature
moved) makes `fit`, `evaluate` and `predict` under a multi-worker strategy
refuse at once, naming the Keras version and what moved, instead of failing
at the first checkpoint or training wrongly. The Keras lines it was run on
are `PROVEN` (the Keras matrix, `.ci/keras-matrix`).

Imported in the task process by the bootstrap (through post-import hooks) and
by the runtime. Standard library at import time; Keras/TensorFlow are only
touched through the modules handed to the hooks. Must not import the launcher
side.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections import namedtuple
from collections.abc import Callable
from types import ModuleType

from .keras_patch import (
    MARK,
    CannotPatch,
    UntestedKerasError,
    allow_unfixed,
    announce,
    expect_params,
    is_chief,
    is_proven,
    keras_version,
    multi_worker_job,
    params_of,
    refusal_message,
    source_of,
)
from .keras_savers import atomic_backups, fix_backup_and_restore, fix_model_checkpoint

TRAINER = "keras.src.backend.tensorflow.trainer"
OPTIMIZER = "keras.src.backend.tensorflow.optimizer"
BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"
# Fixes that could not apply in this process: fix name -> what moved.
_unfixable: dict[str, str] = {}
# Callback classes whose fix could not apply: passing one to fit refuses.
_unfixable_callbacks: dict[type, str] = {}


_SYMBOLIC_REDUCE = "distribute_strategy.reduce("
_MEAN_AXIS_0 = ('"MEAN", v, axis=0', "'MEAN', v, axis=0")


# What one fix did: `patched`, `not needed` (the bug is absent) or `cannot`.
# (A namedtuple, not a dataclass: dataclasses imports inspect, ~10-40 ms at
# every task's start, which a fan-out to many hosts pays on each.)
Outcome = namedtuple("Outcome", ["name", "status", "detail"], defaults=[""])


def _attempt(name: str, fix: Callable[[], str]) -> Outcome:
    try:
        return Outcome(name, fix())
    except CannotPatch as exc:
        _unfixable[name] = str(exc)
        return Outcome(name, "cannot", str(exc))


# ----------------------------------------------------------------------- hooks


def on_trainer(trainer: ModuleType) -> None:
    """Post-import hook of `keras.src.backend.tensorflow.trainer`."""
    version = keras_version()
    if not multi_worker_job():
        announce(f"Keras {version}")
        return
    if getattr(trainer, MARK, False):
        return
    outcomes = [_attempt("symbolic build", lambda: fix_symbolic_build(trainer)),
                _attempt("metric reduction", lambda: fix_reduce_per_replica(trainer))]
    guard_trainer(trainer, version)
    setattr(trainer, MARK, True)
    patched = [o.name for o in outcomes if o.status == "patched"]
    cannot = [f"{o.name}: {o.detail}" for o in outcomes if o.status == "cannot"]
    proven = "" if is_proven(version) else ", a Keras line the matrix has not run"
    if cannot and allow_unfixed():
        announce(f"Keras {version} (cannot patch {'; '.join(cannot)}; running anyway: "
                 "MGPU_KERAS_UNTESTED=allow)")
    elif cannot:
        announce(f"Keras {version} (cannot be patched for MultiWorkerMirroredStrategy: "
                 f"{'; '.join(cannot)}; Model.fit under it will refuse)")
    else:
        announce(f"Keras {version} (patched for MultiWorkerMirroredStrategy: "
                 f"{', '.join(patched) or 'nothing needed'}{proven})")


def on_optimizer(module: ModuleType) -> None:
    """Post-import hook of Keras 3's TensorFlow optimizer."""
    if multi_worker_job() and not getattr(module, MARK, False):
        outcome = _attempt("gradient all-reduce", lambda: fix_gradient_all_reduce(module))
        setattr(module, MARK, True)
        if outcome.status == "patched":
            announce(f"Keras {keras_version()} optimizer patched for "
                     "MultiWorkerMirroredStrategy: gradient all-reduce")


def on_backup(module: ModuleType) -> None:
    if multi_worker_job():
        _callback_fix(module, "BackupAndRestore", fix_backup_and_restore)
        cls = getattr(module, "BackupAndRestore", None)
        if cls is not None and cls not in _unfixable_callbacks:
            atomic_backups(cls, is_chief)


def on_checkpoint(module: ModuleType) -> None:
    if multi_worker_job():
        _callback_fix(module, "ModelCheckpoint", fix_model_checkpoint)


def _callback_fix(module: ModuleType, name: str, fix: Callable[[type], str]) -> None:
    cls = getattr(module, name, None)
    if cls is None:
        _unfixable[name] = f"{module.__name__}.{name} is gone"
        return
    try:
        fix(cls)
    except CannotPatch as exc:
        _unfixable_callbacks[cls] = f"{name}: {exc}"


def on_tf_keras_training(module: ModuleType) -> None:
    """Post-import hook of tf_keras' `Model`: announce tf_keras at the first compile/fit.

    TensorFlow imports tf_keras eagerly under `TF_USE_LEGACY_KERAS=1`, even for a
    script that uses Keras 3, so its import says nothing; compiling a model does.
    """
    cls = module.Model
    if cls.__dict__.get(MARK):
        return

    def announcing(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            version = getattr(sys.modules.get("tf_keras"), "__version__", "?")
            legacy = os.environ.get("TF_USE_LEGACY_KERAS") in ("1", "true", "True")
            announce(f"tf_keras {version}" + (" via tf.keras" if legacy else ""))
            return method(self, *args, **kwargs)

        return wrapper

    cls.compile = announcing(cls.compile)
    cls.fit = announcing(cls.fit)
    setattr(cls, MARK, True)


TF_KERAS_TRAINING = "tf_keras.src.engine.training"
HOOKS = {TRAINER: on_trainer, OPTIMIZER: on_optimizer, BACKUP: on_backup,
         CHECKPOINT: on_checkpoint, TF_KERAS_TRAINING: on_tf_keras_training}


def apply_to_loaded() -> None:
    """Apply the hooks to Keras modules already imported (idempotent).

    For scripts that import the runtime but were not started by the bootstrap.
    """
    for name, hook in HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)


# --------------------------------------------------------------------- the fixes


def _multi_worker(strategy) -> bool:
    """MWMS in multi-worker mode (Keras' own `_collective_all_reduce_multi_worker`)."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode())


def fix_symbolic_build(trainer: ModuleType) -> str:
    """Keras 3.4+ builds the model from an eager average of the first
    distributed batch: under MWMS, let that one reduce return this worker's
    first replica's batch instead (the build needs shapes, not values).

    Wraps the method whatever its arguments or iterator layout (Keras 3.10
    yields pairs, 3.15 triples); it only needs the call to go through
    `self.distribute_strategy.reduce`.
    """
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is None:
        raise CannotPatch(f"{trainer.__name__}.TensorFlowTrainer is gone")
    method = cls.__dict__.get("_maybe_symbolic_build")
    if method is None:
        # Keras 3.3 has no eager symbolic build; a later Keras that still
        # reduces a distributed batch somewhere else would fail here: refuse.
        if _SYMBOLIC_REDUCE in source_of(cls):
            raise CannotPatch("TensorFlowTrainer reduces a distributed batch outside "
                              "_maybe_symbolic_build")
        return "not needed"
    source = source_of(method)
    if source and _SYMBOLIC_REDUCE not in source:
        return "not needed"  # upstream builds without the eager reduce: fixed
    params_of(method, "TensorFlowTrainer._maybe_symbolic_build")

    @functools.wraps(method)
    def _maybe_symbolic_build(self, *args, **kwargs):
        strategy = self._distribute_strategy
        if strategy is None or not _multi_worker(strategy):
            return method(self, *args, **kwargs)
        import tensorflow as tf

        def first_local(reduce_op, value, axis=None):
            def local(v):
                if isinstance(v, tf.distribute.DistributedValues):
                    return strategy.experimental_local_results(v)[0]
                return v

            return tf.nest.map_structure(local, value)

        strategy.reduce = first_local  # shadows the method for this call only
        try:
            return method(self, *args, **kwargs)
        finally:
            del strategy.reduce

    cls._maybe_symbolic_build = _maybe_symbolic_build
    return "patched"


def fix_reduce_per_replica(trainer: ModuleType) -> str:
    """Average scalar metrics over the replicas with `axis=None` (upstream: axis=0)."""
    original = getattr(trainer, "reduce_per_replica", None)
    expect_params(original, ("values", "strategy", "reduction"), "reduce_per_replica")
    source = source_of(original)
    if source and not any(s in source for s in _MEAN_AXIS_0):
        return "not needed"
    calls = source_of(getattr(trainer, "TensorFlowTrainer", None))
    if calls and "reduce_per_replica(" not in calls:
        raise CannotPatch("TensorFlowTrainer no longer calls reduce_per_replica")

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _multi_worker(strategy):
            return original(values, strategy, reduction)
        import tensorflow as tf

        def mean(value):
            local = strategy.experimental_local_results(value)[0]
            # Average scalars over replicas (axis=None); keep upstream's axis=0
            # (mean over the global batch) for anything with a batch dimension.
            axis = 0 if getattr(local.shape, "rank", 0) else None
            return strategy.reduce("MEAN", value, axis=axis)

        return tf.nest.map_structure(mean, values)

    reduce_per_replica.__wrapped__ = original  # type: ignore[attr-defined]
    trainer.reduce_per_replica = reduce_per_replica
    return "patched"


_reduced = threading.local()  # set while an update step's gradients are summed already


def fix_gradient_all_reduce(module: ModuleType) -> str:
    """Sum the gradients over the replicas before the merge call (Keras 3.3).

    Needs `TFOptimizer._backend_update_step(self, grads, trainable_variables,
    learning_rate)` and `_all_reduce_sum_gradients(self, grads_and_vars)`; the
    bug is there when only the merge-call side (`_distributed_tf_update_step`)
    sums them. The inner sum is skipped while the outer one is in effect, so no
    strategy (merge call or not) sums twice.
    """
    cls = getattr(module, "TFOptimizer", None)
    if cls is None:
        raise CannotPatch(f"{module.__name__}.TFOptimizer is gone")
    update = cls.__dict__.get("_backend_update_step")
    distributed = cls.__dict__.get("_distributed_tf_update_step")
    summed = cls.__dict__.get("_all_reduce_sum_gradients")
    if distributed is None or "_all_reduce_sum_gradients(" not in source_of(distributed):
        return "not needed"  # Keras 3.4+: summed before the merge call
    expect_params(update, ("self", "grads", "trainable_variables", "learning_rate"),
                   "TFOptimizer._backend_update_step")
    expect_params(summed, ("self", "grads_and_vars"), "TFOptimizer._all_reduce_sum_gradients")
    if "_all_reduce_sum_gradients(" in source_of(update):
        return "not needed"

    @functools.wraps(update)
    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # In replica context, where an all-reduce can run (as Keras 3.4+).
        pairs = summed(self, list(zip(grads, trainable_variables, strict=False)))
        _reduced.active = True
        try:
            return update(self, [g for g, _ in pairs], trainable_variables, learning_rate)
        finally:
            _reduced.active = False

    @functools.wraps(summed)
    def _all_reduce_sum_gradients(self, grads_and_vars):
        if getattr(_reduced, "active", False):
            return list(grads_and_vars)
        return summed(self, grads_and_vars)

    cls._backend_update_step = _backend_update_step
    cls._all_reduce_sum_gradients = _all_reduce_sum_gradients
    return "patched"


def guard_trainer(trainer: ModuleType, version: str) -> None:
    """fit/evaluate/predict under multi-worker MWMS refuse when a fix they
    need could not apply (at the call, before any step runs)."""
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is None:
        return

    def refuse_if_unfixed(method, self, args, kwargs) -> None:
        if allow_unfixed():
            return
        moved = list(_unfixable.values())
        import inspect

        try:
            bound = inspect.signature(method).bind_partial(self, *args, **kwargs)
            callbacks = bound.arguments.get("callbacks") or []
        except TypeError:
            callbacks = kwargs.get("callbacks") or []
        for callback in callbacks if isinstance(callbacks, list | tuple) else []:
            moved += [why for cls_, why in _unfixable_callbacks.items()
                      if isinstance(callback, cls_)]
        if not moved:
            return
        strategy = getattr(self, "_distribute_strategy", None)
        try:
            multi = _multi_worker(strategy)
        except Exception:  # noqa: BLE001 - internals moved: assume the worst
            multi = True
        if multi:
            raise UntestedKerasError(refusal_message(version, moved))

    def guarded(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            refuse_if_unfixed(method, self, args, kwargs)
            return method(self, *args, **kwargs)

        return wrapper

    for name in ("fit", "evaluate", "predict"):
        if name in cls.__dict__:
            setattr(cls, name, guarded(cls.__dict__[name]))
