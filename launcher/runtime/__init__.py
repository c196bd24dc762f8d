"""Helpers for training scripts: `from launcher import runtime`.

A few lines turn a single-machine script into a multi-worker one without the
classic mistakes (every worker writing the same checkpoint, saving from every
worker, a single-host strategy in a multi-worker job):

    strategy = runtime.strategy()
    with strategy.scope():
        model = build_model()
    model.fit(dataset, callbacks=runtime.callbacks())
    runtime.save_model(model, "model.keras")

Everything here reads the task's environment (`TF_CONFIG`, `MGPU_*`) and works
without the launcher too (one process, default strategy). TensorFlow is
imported lazily so that reading the task identity stays cheap.

Shipped to hosts with the agent. Must not import the launcher side.
"""

from __future__ import annotations

import os
import time

# Input sharding lives in its own module, loaded on first use (`__getattr__`
# below): the bootstrap imports this package in every task, so it stays light.
_DATA_NAMES = frozenset({
    "InputPipeline", "ShardingError", "ShardingWarning", "check_dataset", "check_ps_input",
    "dataset_fn", "distribute", "global_batch_size", "input_pipeline", "list_files",
    "make_dataset", "per_replica_batch_size", "shard", "shard_files",
})


# Keras 3 on JAX (`strategy: keras_distribution`), also loaded on first use.
_KERAS_JAX_NAMES = frozenset({"distribution", "num_processes", "process_id", "shard_arrays"})


def __getattr__(name: str):
    if name in _DATA_NAMES:
        from . import data

        return getattr(data, name)
    if name in _KERAS_JAX_NAMES:
        from . import keras_jax

        return getattr(keras_jax, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "callbacks",
    "checkpoint_dir",
    "is_chief",
    "legacy_device_setter",
    "legacy_session",
    "num_workers",
    "plain_model",
    "report_checkpoint",
    "report_progress",
    "save_model",
    "strategy",
    "task_index",
    "task_type",
    "tf_config",
    *sorted(_DATA_NAMES),
    *sorted(_KERAS_JAX_NAMES),
]


# ----------------------------------------------------------------- task identity


def tf_config() -> dict:
    """The parsed `TF_CONFIG` of this task ({} when run without a cluster)."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}
    import json  # here, as below: every task's start imports this package (~1.5 ms)

    return json.loads(raw)


def task_type() -> str:
    return tf_config().get("task", {}).get("type", "worker")


def task_index() -> int:
    return int(tf_config().get("task", {}).get("index", 0))


def num_workers() -> int:
    """Workers taking part in training (chief included)."""
    cluster = tf_config().get("cluster", {})
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def is_chief() -> bool:
    """True on the task that writes models and final checkpoints.

    That is the `chief` when the cluster has one, else worker 0, as TensorFlow
    decides it; True as well when the script runs alone.
    """
    config = tf_config()
    if not config:
        return True
    kind = task_type()
    if kind == "chief":
        return True
    return kind == "worker" and task_index() == 0 and not config.get("cluster", {}).get("chief")


def checkpoint_dir() -> str:
    """The shared checkpoint directory of the job (`MGPU_CHECKPOINT_DIR`)."""
    return os.environ.get("MGPU_CHECKPOINT_DIR") or os.path.join(os.getcwd(), "checkpoints")


# ------------------------------------------------------------------- strategies


_strategy = None  # the one this process made: a second MWMS would join the cluster again


def strategy(collective_timeout_s: float | None = None, cpu_devices: int | None = None):
    """The strategy this task should train under (made once; later calls return it).

    - `ParameterServerStrategy` on the chief of a `strategy: parameter_server`
      job (the coordinator; workers and ps run the launcher's servers);
    - `MultiWorkerMirroredStrategy` when `TF_CONFIG` names several workers;
      `collective_timeout_s` (or `MGPU_COLLECTIVE_TIMEOUT_S`) bounds a stuck
      collective, so a worker whose peer vanished fails instead of hanging;
    - `MirroredStrategy` over the local GPUs on one host with several;
    - the default strategy otherwise.

    `cpu_devices=N` (or `MGPU_CPU_DEVICES=N`) splits the CPU of a host without
    GPUs into N logical devices, each a replica: 2 workers x 2 devices train
    with 4 replicas in sync, the code path of 2 hosts with 2 GPUs each. Call it
    before any TensorFlow op runs.
    """
    global _strategy
    if _strategy is None:
        _strategy = _make_strategy(collective_timeout_s, cpu_devices)
    return _strategy


def _make_strategy(collective_timeout_s: float | None, cpu_devices: int | None):
    import tensorflow as tf

    from . import strategies

    cpus = strategies.cpu_devices_wanted(cpu_devices)
    # launcher.strategy where used, as below: every task's start imports this
    # package, and the enum module may not be loaded there yet.
    from ..strategy import DEFAULT as DEFAULT_STRATEGY
    from ..strategy import Strategy

    job_strategy = os.environ.get("MGPU_STRATEGY", DEFAULT_STRATEGY)
    if job_strategy == Strategy.PARAMETER_SERVER and tf_config():
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        return tf.distribute.ParameterServerStrategy(resolver)
    if job_strategy == Strategy.LEGACY_SERVER:
        raise RuntimeError("a legacy_server job trains in TF1 graph mode: use "
                           "runtime.legacy_session() instead of runtime.strategy()")
    if num_workers() > 1:
        timeout = collective_timeout_s
        if timeout is None and os.environ.get("MGPU_COLLECTIVE_TIMEOUT_S"):
            timeout = float(os.environ["MGPU_COLLECTIVE_TIMEOUT_S"])
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        return strategies.multi_worker_mirrored(options, cpus)
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    if cpus > 1 and not tf.config.list_physical_devices("GPU"):
        return strategies.mirrored_over_cpus(cpus)
    return tf.distribute.get_strategy()


def legacy_session(config=None):
    """TF1 between-graph training: start this task's server, set the Keras session.

    Builds `tf.compat.v1.train.Server` from `TF_CONFIG` and sets a session on it
    with `tf.compat.v1.keras.backend.set_session`, in graph mode. On a `ps`
    task it never returns: the task serves until the launcher stops it.
    """
    from .legacy import legacy_session as start

    return start(config)


def legacy_device_setter():
    """Device function for `tf.compat.v1.device(...)`: variables on ps, ops here."""
    from .legacy import device_setter

    return device_setter()


# -------------------------------------------------------------------- progress


def report_progress(step: int, **metrics: float) -> None:
    """Tell the launcher how far training got (shown live, used to spot hangs).

    Cheap and safe to call every step: a no-op outside the launcher. Without
    it the launcher still sees the steps of Keras `fit` and of custom loops
    through the optimizer's step counter (`runtime.steps`); once the script
    reports a step itself, only its own reports count.
    """
    global _script_reports_steps
    if not os.environ.get("MGPU_PROGRESS_FD"):
        return
    _script_reports_steps = True
    record = {"step": int(step), "time": time.time()}
    for key, value in metrics.items():
        try:
            record[key] = float(value)
        except (TypeError, ValueError):
            continue
    write_progress(record)


# Set by the first report_progress: the optimizer watcher (runtime.steps) then stops.
_script_reports_steps = False


def steps_reported_by_script() -> bool:
    return _script_reports_steps


def write_progress(record: dict) -> None:
    """One progress record to the launcher (best effort; no-op outside it)."""
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    if "step" in record:  # the checkpoint saves timed since the last report (runtime.saves)
        from . import saves

        seconds = saves.take()
        if seconds > 0:
            record = {**record, "save_s": round(record.get("save_s", 0.0) + seconds, 4)}
    from . import position  # where this task is: the launcher compares (job/detect/lockstep.py)

    record = {**position.fields(), **record}
    import json

    try:
        os.write(int(fd), (json.dumps(record, default=_plain) + "\n").encode())
    except (OSError, ValueError, TypeError):
        pass  # progress is best effort; never break training over it


def _plain(value):
    """A numpy scalar (a step or position read from a tensor) as the number it holds."""
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def report_checkpoint(step: int, **metrics: float) -> None:
    """Tell the launcher a checkpoint of `step` was saved (custom training loops).

    A restart after a saved checkpoint is progress, free of `max_restarts`;
    `runtime.callbacks()` reports its own saves. A no-op outside the launcher.
    """
    report_progress(step, checkpoint=1, **metrics)


def report_saved(step: int | None, directory: str, saved_with: str = "",
                 by_runtime: bool = False) -> None:
    """A checkpoint save completed (the bootstrap's save hooks, runtime.saves):
    its step and directory, and progress; what saved it (`saved_with`: keras3,
    tf_keras, tensorflow...; `by_runtime`: the callback of `callbacks()`). A
    report of its own, at once: the save's time goes with it, and a task
    killed right after still proved it."""
    if not os.environ.get("MGPU_PROGRESS_FD"):
        return
    record: dict = {"checkpoint": 1, "saved_dir": short_path(directory), "time": time.time()}
    if saved_with:
        record["saved_with"] = saved_with
    if by_runtime:
        record["saved_by_runtime"] = 1
    if step is not None:
        record["saved"] = int(step)
        if not steps_reported_by_script():  # a step of the optimizer's count (runtime.steps)
            record.update(step=int(step), counted=1)
    if is_chief():
        record["chief"] = 1
    write_progress(record)


def report_resumed(step: int, directory: str | None = None) -> None:
    """Where this process resumed training: the step its restore left the
    optimizer at (the bootstrap's restore hooks, runtime.restores)."""
    if not os.environ.get("MGPU_PROGRESS_FD"):
        return
    record: dict = {"resumed": int(step), "time": time.time()}
    if directory:
        record["resumed_dir"] = short_path(directory)
    write_progress(record)


def short_path(path: str, limit: int = 200) -> str:
    """A path that fits a progress string (launcher/job/run/protocol.py keeps 200)."""
    return path if len(path) <= limit else "…" + path[-(limit - 1):]


def _keras(model=None):
    """The Keras the script uses: tf_keras or Keras 3 (their callbacks do not mix).

    Taken from `model`'s class when given; else Keras 3 if the script imported
    it (`import keras`), else what `tf.keras` resolves to (tf_keras when
    `TF_USE_LEGACY_KERAS=1`, which TensorFlow imports eagerly).
    """
    import sys

    for klass in type(model).__mro__ if model is not None else ():
        root = klass.__module__.split(".")[0]
        if root == "tf_keras":
            import tf_keras

            return tf_keras
        if root == "keras":
            import keras

            return _keras3(keras)
    if "keras.src.backend.tensorflow.trainer" in sys.modules:
        import keras

        return _keras3(keras)
    keras = sys.modules.get("keras")
    backend = getattr(getattr(keras, "backend", None), "backend", None)
    if callable(backend) and backend() != "tensorflow":
        return keras  # Keras 3 on JAX (or torch): tf.keras is not the script's Keras
    import tensorflow as tf

    keras = tf.keras
    return _keras3(keras) if keras.__name__.startswith("keras") else keras


def _keras3(keras):
    """Keras 3, with the multi-worker fixes applied (also without the bootstrap)."""
    from . import keras_compat

    keras_compat.apply_to_loaded()
    return keras


def _save_freq(value: str | int | None) -> str | int:
    if value is None:
        value = os.environ.get("MGPU_SAVE_FREQ", "epoch")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def callbacks(save_freq: str | int | None = None, progress_every_s: float = 0.5,
              model=None, save_on_sigterm: bool = False) -> list:
    """Keras callbacks for a fault-tolerant multi-worker `fit`.

    - `BackupAndRestore` in `<checkpoint_dir>/backup`: a restarted job resumes
      where the last checkpoint left it. Only the chief writes there; the other
      workers write to temporary paths deleted at once (tf_keras does this
      itself; for Keras 3 the runtime's `keras_compat` does), and every worker
      restores from it;
    - progress reports to the launcher (step, loss, metrics).

    The callbacks are those of the Keras the script uses (see `_keras`); pass
    `model=` to decide when a script imports both tf_keras and Keras 3.

    `save_on_sigterm=True` (tf_keras under MultiWorkerMirroredStrategy) saves
    the current step when the launcher stops the job with SIGTERM (Ctrl-C,
    preemption), then exits 42 so a new launch resumes from that very step.
    Off by default: with it on, a restart after a worker was *killed* (not
    terminated) failed here with mismatched collectives (TF 2.21, tf_keras 2.21).
    """
    keras = _keras(model)
    options = {}
    if save_on_sigterm and _preemption_save_possible(keras):
        options["save_before_preemption"] = True
    backup = keras.callbacks.BackupAndRestore(
        backup_dir=os.path.join(checkpoint_dir(), "backup"), save_freq=_save_freq(save_freq),
        **options,
    )
    backup._mgpu_runtime = True  # its saves say so (runtime.saves.RUNTIME_MARK): the drill's advice
    # The PS coordinator cannot run batch-level callbacks (Keras refuses them).
    from ..strategy import Strategy

    batch_level = os.environ.get("MGPU_STRATEGY") != Strategy.PARAMETER_SERVER
    saves = _save_freq(save_freq)
    return [backup, _progress_callback(keras, progress_every_s, batch_level,
                                       saves if isinstance(saves, int) else None)]


def _preemption_save_possible(keras) -> bool:
    """Save on SIGTERM (then exit 42, "restart me") with TensorFlow's own
    PreemptionCheckpointHandler: tf_keras under MultiWorkerMirroredStrategy only
    (the handler refuses ParameterServerStrategy; Keras 3 has no equivalent).

    tf_keras turns the option on only when the GCE metadata server answers; off
    GCP the handler works as is (it treats SIGTERM as the termination notice),
    so the runtime tells tf_keras it is supported.
    """
    if not keras.__name__.startswith("tf_keras") or num_workers() < 2:
        return False
    from ..strategy import DEFAULT as DEFAULT_STRATEGY
    from ..strategy import Strategy

    if os.environ.get("MGPU_STRATEGY", DEFAULT_STRATEGY) != Strategy.MULTI_WORKER_MIRRORED:
        return False
    try:
        from tf_keras.src.distribute import worker_training_state
    except ImportError:
        return False
    if not hasattr(worker_training_state, "support_on_demand_checkpoint_callback"):
        return False  # another tf_keras layout: keep its own behaviour
    worker_training_state.support_on_demand_checkpoint_callback = lambda strategy: True
    return True


def _progress_callback(keras, every_s: float, batch_level: bool = True,
                       save_every_steps: int | None = None):
    """`save_every_steps`: the backup's integer `save_freq` (None: it saves at
    each epoch's end). The reporter runs after the backup callback, so it
    reports `checkpoint` once the backup has saved: the launcher's proof that
    the training moved (a restart after it does not count as a crash loop).
    After a restart, the first epoch it sees begin is where the job resumed
    (after the backup's restore): reported as `start_epoch` with the optimizer's
    restored step count (`start_step`), for the launcher's `resumed` notice."""

    class ProgressReporter(keras.callbacks.Callback):
        """Reports step and metrics at most every `every_s` seconds and per epoch."""

        def __init__(self) -> None:
            super().__init__()
            self.step, self.epoch, self.last, self.began = 0, 0, 0.0, False

        def on_epoch_begin(self, epoch, logs=None):
            if not self.began and _restarted():
                report_progress(self.step, epoch=epoch, start_epoch=1,
                                **_restored_step(self.model))
            self.began = True
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            saved = save_every_steps is not None and self.step % save_every_steps == 0 \
                and not _mid_epoch_saves_skipped(self.model)
            now = time.monotonic()
            if saved or now - self.last >= every_s:
                self.last = now
                extra = {"checkpoint": 1} if saved and not _weights_spoiled() else {}
                report_progress(self.step, epoch=self.epoch, **extra, **_scalars(logs))

        def on_epoch_end(self, epoch, logs=None):
            saved = (save_every_steps is None or _mid_epoch_saves_skipped(self.model)) \
                and not _weights_spoiled()
            report_progress(self.step, epoch=epoch, epoch_end=1, **_scalars(logs),
                            **({"checkpoint": 1} if saved else {}))

    class EpochProgressReporter(keras.callbacks.Callback):
        """Per-epoch reports only: ParameterServerStrategy refuses batch-level callbacks."""

        began = False

        def on_epoch_begin(self, epoch, logs=None):
            if not self.began and _restarted():
                steps = (self.params or {}).get("steps") or 0
                report_progress(epoch * int(steps), epoch=epoch, start_epoch=1,
                                **_restored_step(self.model))
            self.began = True

        def on_epoch_end(self, epoch, logs=None):
            steps = (self.params or {}).get("steps") or 0
            extra = {} if save_every_steps is not None or _weights_spoiled() else \
                {"checkpoint": 1}
            report_progress((epoch + 1) * int(steps), epoch=epoch, epoch_end=1,
                            **extra, **_scalars(logs))

    return ProgressReporter() if batch_level else EpochProgressReporter()


def _weights_spoiled() -> bool:
    """The backup's save just now was refused, its weights not finite
    (runtime/saves.py: the sentinel reads a step's loss a step late, so a
    save at the bad step is refused before the loss is seen), or the sentinel
    saw this process's loss go bad: no save is reported as made."""
    from .saves import last_refused
    from .sentinel import spoiled

    return last_refused() or spoiled()


def _mid_epoch_saves_skipped(model) -> bool:
    """fit's input cannot continue mid-epoch after a restart: its backup saves
    at epoch ends only (runtime/epochinput.py), so no save is reported between."""
    return bool(getattr(model, "_mgpu_input", ""))


def _restarted() -> bool:
    """A later generation of the job (it restored a checkpoint, if there was one)."""
    return os.environ.get("MGPU_GENERATION", "0") not in ("", "0")


def _restored_step(model) -> dict[str, int]:
    """{"start_step": the optimizer's step count} (restored by a backup), when readable."""
    try:
        return {"start_step": int(model.optimizer.iterations.numpy())}
    except Exception:  # no optimizer yet, or a layout without `iterations`
        return {}


def _scalars(logs: dict | None) -> dict[str, float]:
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


# ---------------------------------------------------------------------- saving


def plain_model(model):
    """The template model inside a data-parallel wrapper; `model` itself otherwise.

    `multi_gpu_model(model, gpus=N)` and `make_parallel` returned a wrapper:
    the inputs sliced by `Lambda` layers, the template called once per slice,
    the outputs joined by `Concatenate`. Saving that wrapper (the classic
    mistake) nests the model one level deeper at each reload.
    """
    layers = list(getattr(model, "layers", []))
    inner = [layer for layer in layers if hasattr(layer, "layers") and hasattr(layer, "save")]
    kinds = [type(layer).__name__ for layer in layers if layer not in inner]
    if (len(inner) == 1 and kinds.count("Lambda") >= 2 and "Concatenate" in kinds
            and set(kinds) <= {"InputLayer", "Lambda", "Concatenate"}):
        return inner[0]
    return model


def save_model(model, path: str, **save_kwargs) -> str | None:
    """Save the plain model from the chief; returns the path written, or None.

    Every worker must call this: saving under a multi-worker strategy may run
    collective ops. Non-chief workers write to a temporary directory that is
    deleted at once, so only the chief's file lands at `path`. What is saved
    is the plain model: given a parallel wrapper (see `plain_model`), the
    template inside it is saved, and a line says so.
    """
    plain = plain_model(model)
    if plain is not model:
        print(f"mgpu-launch: save_model: saving the template model {plain.name!r}, "
              f"not the parallel wrapper {model.name!r}", flush=True)
    if is_chief():
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)  # Keras 3 does not create it
        plain.save(path, **save_kwargs)
        return path
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix=f"mgpu-{task_type()}{task_index()}-")
    try:
        plain.save(os.path.join(scratch, os.path.basename(path.rstrip("/")) or "model"),
                   **save_kwargs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None
