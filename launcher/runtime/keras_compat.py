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

Keras 3's `BackupAndRestore` and `ModelCheckpoint` are not multi-worker aware:
every worker creates the same directory and writes the same files. Here, on a
worker other than the chief, they write to a private temporary directory that
is deleted at once; every worker still *reads* the shared backup on restart,
so all of them resume from the chief's state.

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
import json
import os
import sys
import threading
from collections import namedtuple
from collections.abc import Callable
from types import ModuleType

from ..strategy import DEFAULT as DEFAULT_STRATEGY
from ..strategy import Strategy

# Keras 3 lines the Keras matrix runs the e2e tests on (with TF 2.16, 2.19, 2.21).
PROVEN = ("3.3.", "3.10.", "3.15.")
TRAINER = "keras.src.backend.tensorflow.trainer"
OPTIMIZER = "keras.src.backend.tensorflow.optimizer"
BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"
_MARK = "_mgpu_patched"
_announced: set[str] = set()
# Fixes that could not apply in this process: fix name -> what moved.
_unfixable: dict[str, str] = {}
# Callback classes whose fix could not apply: passing one to fit refuses.
_unfixable_callbacks: dict[type, str] = {}


class UntestedKerasError(RuntimeError):
    """Keras 3 `fit` under a multi-worker strategy, on a Keras whose private code moved."""


class CannotPatch(Exception):
    """The code a fix patches is not what it expects (its message says what moved)."""


# ------------------------------------------------------------------ environment


def keras_version() -> str:
    """The installed Keras 3 version (`MGPU_KERAS_VERSION_OVERRIDE` wins, for tests)."""
    override = os.environ.get("MGPU_KERAS_VERSION_OVERRIDE")
    if override:
        return override
    try:
        from importlib import metadata

        return metadata.version("keras")
    except Exception:  # noqa: BLE001 - metadata may be missing in odd installs
        module = sys.modules.get("keras.src.version")
        return getattr(module, "__version__", "unknown")


def is_proven(version: str) -> bool:
    """A Keras line the matrix ran the e2e tests on (said in the announcement only)."""
    return version.startswith(PROVEN)


def multi_worker_job() -> bool:
    """A task of a job whose workers train in sync (MWMS over several workers)."""
    try:
        workers = int(os.environ.get("MGPU_NUM_WORKERS", "1"))
    except ValueError:
        workers = 1
    if workers <= 1:
        cluster = _tf_config().get("cluster", {})
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    return workers > 1 and os.environ.get("MGPU_STRATEGY", DEFAULT_STRATEGY) == (
        Strategy.MULTI_WORKER_MIRRORED
    )


def _tf_config() -> dict:
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}


def is_chief() -> bool:
    config = _tf_config()
    task = config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief" or not config:
        return True
    return kind == "worker" and index == 0 and not config.get("cluster", {}).get("chief")


def _allow_unfixed() -> bool:
    return os.environ.get("MGPU_KERAS_UNTESTED") == "allow"


def announce(text: str) -> None:
    """Print one line about the Keras in use, once per text."""
    if text in _announced:
        return
    _announced.add(text)
    print(f"mgpu-launch: {text}", file=sys.stderr, flush=True)


def refusal_message(version: str, moved: list[str] | tuple[str, ...] = ()) -> str:
    what = "; ".join(moved) or "its private code moved"
    return (
        f"Keras {version}: mgpu-launch cannot fix Model.fit under "
        "MultiWorkerMirroredStrategy on this Keras; refusing rather than training wrongly. "
        "Fix: set `keras: tf_keras` and use tf.keras, or install a Keras the launcher "
        f"was proven on ({', '.join(p + 'x' for p in PROVEN)}; e.g. keras==3.15.*). "
        f"What moved: {what}. Why: upstream Keras 3 fit is broken under this strategy "
        "(keras-team/keras#20585) and mgpu-launch's fix reaches into private Keras code. "
        "Other ways out: a custom training loop (strategy.run), or, at your own risk, "
        "MGPU_KERAS_UNTESTED=allow to run this Keras without the fixes that cannot apply."
    )


# ------------------------------------------------------------ capability checks


def _source(obj: object) -> str:
    import inspect  # here, as in _params: the bootstrap imports this module in every task

    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""  # no source shipped: the bug cannot be confirmed


def _params(func: object, what: str) -> list[str]:
    if not callable(func):
        raise CannotPatch(f"{what} is gone")
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        raise CannotPatch(f"{what} has no readable signature") from exc


def _expect_params(func: object, expected: tuple[str, ...], what: str) -> None:
    params = _params(func, what)
    if tuple(params) != expected:
        raise CannotPatch(f"{what}({', '.join(params)}) is not {what}({', '.join(expected)})")


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
    if getattr(trainer, _MARK, False):
        return
    outcomes = [_attempt("symbolic build", lambda: fix_symbolic_build(trainer)),
                _attempt("metric reduction", lambda: fix_reduce_per_replica(trainer))]
    guard_trainer(trainer, version)
    setattr(trainer, _MARK, True)
    patched = [o.name for o in outcomes if o.status == "patched"]
    cannot = [f"{o.name}: {o.detail}" for o in outcomes if o.status == "cannot"]
    proven = "" if is_proven(version) else ", a Keras line the matrix has not run"
    if cannot and _allow_unfixed():
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
    if multi_worker_job() and not getattr(module, _MARK, False):
        outcome = _attempt("gradient all-reduce", lambda: fix_gradient_all_reduce(module))
        setattr(module, _MARK, True)
        if outcome.status == "patched":
            announce(f"Keras {keras_version()} optimizer patched for "
                     "MultiWorkerMirroredStrategy: gradient all-reduce")


def on_backup(module: ModuleType) -> None:
    if multi_worker_job():
        _callback_fix(module, "BackupAndRestore", fix_backup_and_restore)


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
    if cls.__dict__.get(_MARK):
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
    setattr(cls, _MARK, True)


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
        if _SYMBOLIC_REDUCE in _source(cls):
            raise CannotPatch("TensorFlowTrainer reduces a distributed batch outside "
                              "_maybe_symbolic_build")
        return "not needed"
    source = _source(method)
    if source and _SYMBOLIC_REDUCE not in source:
        return "not needed"  # upstream builds without the eager reduce: fixed
    _params(method, "TensorFlowTrainer._maybe_symbolic_build")

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
    _expect_params(original, ("values", "strategy", "reduction"), "reduce_per_replica")
    source = _source(original)
    if source and not any(s in source for s in _MEAN_AXIS_0):
        return "not needed"
    calls = _source(getattr(trainer, "TensorFlowTrainer", None))
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
    if distributed is None or "_all_reduce_sum_gradients(" not in _source(distributed):
        return "not needed"  # Keras 3.4+: summed before the merge call
    _expect_params(update, ("self", "grads", "trainable_variables", "learning_rate"),
                   "TFOptimizer._backend_update_step")
    _expect_params(summed, ("self", "grads_and_vars"), "TFOptimizer._all_reduce_sum_gradients")
    if "_all_reduce_sum_gradients(" in _source(update):
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
        if _allow_unfixed():
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
    if cls.__dict__.get(_MARK):
        return "patched"
    original_save = cls.__dict__.get("_save_model")
    _expect_params(original_save, ("self",), "BackupAndRestore._save_model")
    original_end = cls.__dict__.get("on_train_end")
    _expect_params(original_end, ("self", "logs"), "BackupAndRestore.on_train_end")
    if "self.backup_dir" not in _source(cls.__init__):
        raise CannotPatch("BackupAndRestore no longer keeps self.backup_dir")
    if _chief_aware(_source(original_save)):
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
    setattr(cls, _MARK, True)
    return "patched"


def fix_model_checkpoint(cls: type) -> str:
    """Non-chief workers save to a temporary path deleted right after the save."""
    if cls.__dict__.get(_MARK):
        return "patched"
    original_save = cls.__dict__.get("_save_model")
    original_path = cls.__dict__.get("_get_file_path")
    _expect_params(original_save, ("self", "epoch", "batch", "logs"),
                   "ModelCheckpoint._save_model")
    _expect_params(original_path, ("self", "epoch", "batch", "logs"),
                   "ModelCheckpoint._get_file_path")
    if _chief_aware(_source(original_save)):
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
    setattr(cls, _MARK, True)
    return "patched"
