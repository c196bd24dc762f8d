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

import json
import os
import shutil
import tempfile
import time
from typing import Any

__all__ = [
    "callbacks",
    "checkpoint_dir",
    "is_chief",
    "num_workers",
    "report_progress",
    "save_model",
    "strategy",
    "task_index",
    "task_type",
    "tf_config",
]


# ----------------------------------------------------------------- task identity


def tf_config() -> dict[str, Any]:
    """The parsed `TF_CONFIG` of this task ({} when run without a cluster)."""
    raw = os.environ.get("TF_CONFIG", "")
    return json.loads(raw) if raw.strip() else {}


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


def strategy(collective_timeout_s: float | None = None):
    """The strategy this task should train under.

    - `MultiWorkerMirroredStrategy` when `TF_CONFIG` names several workers;
      `collective_timeout_s` (or `MGPU_COLLECTIVE_TIMEOUT_S`) bounds a stuck
      collective, so a worker whose peer vanished fails instead of hanging;
    - `MirroredStrategy` over the local GPUs on one host with several;
    - the default strategy otherwise.
    """
    import tensorflow as tf

    if num_workers() > 1:
        timeout = collective_timeout_s
        if timeout is None and os.environ.get("MGPU_COLLECTIVE_TIMEOUT_S"):
            timeout = float(os.environ["MGPU_COLLECTIVE_TIMEOUT_S"])
        options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if len(tf.config.list_physical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


# -------------------------------------------------------------------- progress


def report_progress(step: int, **metrics: float) -> None:
    """Tell the launcher how far training got (shown live, used to spot hangs).

    Cheap and safe to call every step: a no-op outside the launcher.
    """
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    record = {"step": int(step), "time": time.time()}
    for key, value in metrics.items():
        try:
            record[key] = float(value)
        except (TypeError, ValueError):
            continue
    try:
        os.write(int(fd), (json.dumps(record) + "\n").encode())
    except OSError:
        pass  # progress is best effort; never break training over it


def _keras():
    """The Keras that `tf.keras` resolves to in this process (tf_keras or Keras 3)."""
    import tensorflow as tf

    return tf.keras


def _save_freq(value: str | int | None) -> str | int:
    if value is None:
        value = os.environ.get("MGPU_SAVE_FREQ", "epoch")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def callbacks(save_freq: str | int | None = None, progress_every_s: float = 0.5) -> list:
    """Keras callbacks for a fault-tolerant multi-worker `fit`.

    - `BackupAndRestore` in `<checkpoint_dir>/backup`: a restarted job resumes
      where the last checkpoint left it (TensorFlow writes the chief's copy
      there and gives the other workers temporary paths);
    - progress reports to the launcher (step, loss, metrics).
    """
    keras = _keras()
    backup = keras.callbacks.BackupAndRestore(
        backup_dir=os.path.join(checkpoint_dir(), "backup"), save_freq=_save_freq(save_freq)
    )
    return [backup, _progress_callback(keras, progress_every_s)]


def _progress_callback(keras, every_s: float):
    class ProgressReporter(keras.callbacks.Callback):
        """Reports step and metrics at most every `every_s` seconds and per epoch."""

        def __init__(self) -> None:
            super().__init__()
            self.step = 0
            self.epoch = 0
            self.last = 0.0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            now = time.monotonic()
            if now - self.last >= every_s:
                self.last = now
                report_progress(self.step, epoch=self.epoch, **_scalars(logs))

        def on_epoch_end(self, epoch, logs=None):
            report_progress(self.step, epoch=epoch, epoch_end=1, **_scalars(logs))

    return ProgressReporter()


def _scalars(logs: dict | None) -> dict[str, float]:
    out = {}
    for key, value in (logs or {}).items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            continue
    return out


# ---------------------------------------------------------------------- saving


def save_model(model, path: str, **save_kwargs) -> str | None:
    """Save the plain model from the chief; returns the path written, or None.

    Every worker must call this: saving under a multi-worker strategy may run
    collective ops. Non-chief workers write to a temporary directory that is
    deleted at once, so only the chief's file lands at `path`. Pass the model
    you built, not a wrapper: what is saved is exactly `model`.
    """
    if is_chief():
        model.save(path, **save_kwargs)
        return path
    scratch = tempfile.mkdtemp(prefix=f"mgpu-{task_type()}{task_index()}-")
    try:
        model.save(os.path.join(scratch, os.path.basename(path.rstrip("/")) or "model"),
                   **save_kwargs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return None
