"""Keras 3 `Model.fit` under MultiWorkerMirroredStrategy, made to work (and to refuse).

Upstream Keras 3 (keras-team/keras#20585) breaks in two spots of
`keras/src/backend/tensorflow/trainer.py` when several workers train under
`MultiWorkerMirroredStrategy` (docs/design.md, "Keras on this stack"):

1. `_maybe_symbolic_build` averages the first distributed batch with an eager
   `strategy.reduce(...)`, which the collective strategy cannot do on a
   `PerReplica` batch. Building needs only shapes and dtypes: one local
   replica's batch is enough, and no collective runs.
2. `reduce_per_replica` reduces every logged value with `axis=0`, which fails
   on scalars; a scalar is averaged over the replicas with `axis=None`.

Keras 3's `BackupAndRestore` and `ModelCheckpoint` are not multi-worker aware:
every worker creates the same directory and writes the same files. Here, on a
worker other than the chief, they write to a private temporary directory that
is deleted at once; every worker still *reads* the shared backup on restart,
so all of them resume from the chief's state.

The patches reach into private Keras code, so they apply only to the Keras
versions they were tested with (`TESTED`). On another version, `fit`,
`evaluate` and `predict` under a multi-worker MirroredStrategy refuse with the
reason and the ways out instead of training wrongly.

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
from types import ModuleType

# Keras 3 release lines these patches were written against and tested on.
TESTED = ("3.15.",)
TRAINER = "keras.src.backend.tensorflow.trainer"
BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"
_MARK = "_mgpu_patched"
_announced: set[str] = set()


class UntestedKerasError(RuntimeError):
    """Keras 3 `fit` under a multi-worker strategy, on a Keras we never tested."""


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


def is_tested(version: str) -> bool:
    return version.startswith(TESTED)


def multi_worker_job() -> bool:
    """A task of a job whose workers train in sync (MWMS over several workers)."""
    try:
        workers = int(os.environ.get("MGPU_NUM_WORKERS", "1"))
    except ValueError:
        workers = 1
    if workers <= 1:
        cluster = _tf_config().get("cluster", {})
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    return workers > 1 and os.environ.get("MGPU_STRATEGY", "multi_worker_mirrored") == (
        "multi_worker_mirrored"
    )


def _tf_config() -> dict:
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}


def _is_chief() -> bool:
    config = _tf_config()
    task = config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief" or not config:
        return True
    return kind == "worker" and index == 0 and not config.get("cluster", {}).get("chief")


def announce(text: str) -> None:
    """Print one line about the Keras in use, once per text."""
    if text in _announced:
        return
    _announced.add(text)
    print(f"mgpu-launch: {text}", file=sys.stderr, flush=True)


def refusal_message(version: str) -> str:
    tested = ", ".join(f"{t}*" for t in TESTED)
    return (
        f"Keras {version} is untested with mgpu-launch for Model.fit under "
        f"MultiWorkerMirroredStrategy; refusing rather than training wrongly. Fix: pin "
        f"keras=={TESTED[0]}*, or set `keras: tf_keras` and use tf.keras. Why: upstream "
        "Keras 3 fit is broken under this strategy (keras-team/keras#20585); mgpu-launch "
        f"patches it only on the versions it has checked ({tested}). Other ways out: a "
        "custom training loop (strategy.run), or, at your own risk, "
        "MGPU_KERAS_UNTESTED=allow to run this Keras unpatched."
    )


# ----------------------------------------------------------------------- hooks


def on_trainer(trainer: ModuleType) -> None:
    """Post-import hook of `keras.src.backend.tensorflow.trainer`."""
    version = keras_version()
    if not multi_worker_job():
        announce(f"Keras {version}")
        return
    if is_tested(version):
        patch_trainer(trainer)
        announce(f"Keras {version} (patched for MultiWorkerMirroredStrategy)")
    elif os.environ.get("MGPU_KERAS_UNTESTED") == "allow":
        announce(f"Keras {version} (untested, unpatched: MGPU_KERAS_UNTESTED=allow)")
    else:
        guard_trainer(trainer, version)
        announce(f"Keras {version} (untested: Model.fit under MultiWorkerMirroredStrategy "
                 "will refuse to run)")


def on_backup(module: ModuleType) -> None:
    if multi_worker_job() and is_tested(keras_version()):
        patch_backup_and_restore(module.BackupAndRestore)


def on_checkpoint(module: ModuleType) -> None:
    if multi_worker_job() and is_tested(keras_version()):
        patch_model_checkpoint(module.ModelCheckpoint)


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
HOOKS = {TRAINER: on_trainer, BACKUP: on_backup, CHECKPOINT: on_checkpoint,
         TF_KERAS_TRAINING: on_tf_keras_training}


def apply_to_loaded() -> None:
    """Apply the hooks to Keras modules already imported (idempotent).

    For scripts that import the runtime but were not started by the bootstrap.
    """
    for name, hook in HOOKS.items():
        module = sys.modules.get(name)
        if module is not None:
            hook(module)


# --------------------------------------------------------------------- patches


def _multi_worker(trainer: ModuleType, strategy) -> bool:
    return strategy is not None and trainer._collective_all_reduce_multi_worker(strategy)


def patch_trainer(trainer: ModuleType) -> None:
    """Fix the two spots of `trainer` (a tested Keras 3) for multi-worker MWMS."""
    if getattr(trainer, _MARK, False):
        return
    import tensorflow as tf

    cls = trainer.TensorFlowTrainer
    original_build = cls._maybe_symbolic_build
    original_reduce = trainer.reduce_per_replica

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or not _multi_worker(trainer, strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)

        def first_local(value):
            if isinstance(value, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(value)[0]
            return value

        # As upstream, but build from this worker's first replica: a symbolic
        # build needs shapes and dtypes, not an eager cross-worker average.
        for _, _, it in iterator:
            data_batch = tf.nest.map_structure(first_local, next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _multi_worker(trainer, strategy):
            return original_reduce(values, strategy, reduction)

        def mean(value):
            local = strategy.experimental_local_results(value)[0]
            # Average scalars over replicas (axis=None); keep upstream's axis=0
            # (mean over the global batch) for anything with a batch dimension.
            axis = 0 if getattr(local.shape, "rank", 0) else None
            return strategy.reduce("MEAN", value, axis=axis)

        return tf.nest.map_structure(mean, values)

    cls._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica
    setattr(trainer, _MARK, True)


def guard_trainer(trainer: ModuleType, version: str) -> None:
    """On an untested Keras: make fit/evaluate/predict under multi-worker MWMS refuse."""
    if getattr(trainer, _MARK, False):
        return
    cls = getattr(trainer, "TensorFlowTrainer", None)
    if cls is None:
        return

    def refuse_if_multi_worker(self) -> None:
        strategy = getattr(self, "_distribute_strategy", None)
        try:
            import tensorflow as tf

            multi = isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
                strategy.extended._in_multi_worker_mode()
            )
        except Exception:  # noqa: BLE001 - internals moved: assume the worst
            multi = True
        if multi:
            raise UntestedKerasError(refusal_message(version))

    def guarded(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            refuse_if_multi_worker(self)
            return method(self, *args, **kwargs)

        return wrapper

    for name in ("fit", "evaluate", "predict"):
        if hasattr(cls, name):
            setattr(cls, name, guarded(getattr(cls, name)))
    setattr(trainer, _MARK, True)


_BACKUP_PATHS = ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


def patch_backup_and_restore(cls: type) -> None:
    """Non-chief workers back up to a private temporary dir; every worker restores."""
    if getattr(cls, _MARK, False):
        return
    original_save = cls._save_model
    original_end = cls.on_train_end

    def _save_model(self):
        if _is_chief():
            return original_save(self)
        scratch = self.__dict__.get("_mgpu_scratch")
        if scratch is None:
            import tempfile

            scratch = self._mgpu_scratch = tempfile.mkdtemp(prefix="mgpu-backup-")
        shared = {name: getattr(self, name) for name in ("backup_dir", *_BACKUP_PATHS)}
        self.backup_dir = scratch
        for name in _BACKUP_PATHS:
            setattr(self, name, os.path.join(scratch, os.path.basename(shared[name])))
        try:
            return original_save(self)
        finally:
            for name, value in shared.items():
                setattr(self, name, value)

    def on_train_end(self, logs=None):
        scratch = self.__dict__.pop("_mgpu_scratch", None)
        if scratch is not None:
            import shutil

            shutil.rmtree(scratch, ignore_errors=True)
        if _is_chief():  # only the chief deletes the shared backup
            return original_end(self, logs)
        return None

    cls._save_model = _save_model
    cls.on_train_end = on_train_end
    setattr(cls, _MARK, True)


def patch_model_checkpoint(cls: type) -> None:
    """Non-chief workers save to a temporary path deleted right after the save."""
    if getattr(cls, _MARK, False):
        return
    original_save = cls._save_model
    original_path = cls._get_file_path

    def _get_file_path(self, epoch, batch, logs):
        path = original_path(self, epoch, batch, logs)
        scratch = self.__dict__.get("_mgpu_scratch")
        if scratch is None:
            return path
        return os.path.join(scratch, os.path.basename(path))

    def _save_model(self, epoch, batch, logs):
        if _is_chief():
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
