"""`keras: auto` and tf.keras-era scripts: restart once under tf_keras.

Under `keras: auto` a task gets the Keras it gets when run by hand: Keras 3 for
`tf.keras` since TensorFlow 2.16. Scripts written for tf.keras = Keras 2 (TF's
own parameter-server and custom-loop tutorials among them) die under it of
errors that launcher/job/record/classify.py already recognizes as tf_keras-only
(`keras.optimizers.legacy`, `metric.reset_states()`, `save_weights("ckpt")`,
...), or of any error raised inside Keras 3's own code before a step trained
in a script that names `tf.keras` (the bootstrap says where the error was
raised and what the script names: `tf_keras_era`), such as "A KerasTensor
cannot be used as input to a TensorFlow function" (the parameter-server
tutorial's `tf.reduce_mean` on a layer's output). Detecting that before the
start would mean guessing from source text; the error is certain. So when a
generation fails of such an error, the next generation runs under tf_keras
(`TF_USE_LEGACY_KERAS=1`, as `keras: tf_keras` sets), once, said in a notice, a
`keras_switched` event and the summary.

Never switched: a job whose Keras was chosen (`keras: keras3` or `tf_keras`,
or `TF_USE_LEGACY_KERAS` in the cluster file's `env`), Keras 3 on JAX
(`keras_distribution`), or a failure of any other kind. A job that really
needs Keras 3 does not fail of a tf_keras-only error, so it is never switched.

Pure functions over the plan and the failure; no I/O.
"""

from __future__ import annotations

from typing import Any

from ...spec.plan import Plan
from ...strategy import ON_JAX
from ..record.classify import tf_keras_hint
from ..record.states import Failure

# What `keras: tf_keras` puts in every task's environment (taskenv.keras_env).
TF_KERAS_ENV = {"TF_USE_LEGACY_KERAS": "1", "MGPU_KERAS": "tf_keras"}


def should_switch(plan: Plan, failure: Failure | None, trained: bool = False) -> bool:
    """Restart `plan`'s job under tf_keras after `failure`? `trained`: a step
    of the failed generation was reported."""
    if failure is None or plan.strategy in ON_JAX or not plan.tasks:
        return False
    for task in plan.tasks:
        if task.env.get("MGPU_KERAS", "auto") != "auto" or "TF_USE_LEGACY_KERAS" in task.env:
            return False  # Keras was chosen: by the `keras:` key or the cluster file's env
    return tf_keras_hint(failure.error, failure.last_lines) is not None \
        or tf_keras_era(failure.error, trained)


def tf_keras_era(error: dict | None, trained: bool) -> bool:
    """The rule beyond the known texts: raised inside Keras 3's own code (the
    bootstrap's `raised_in_keras3`), before any step trained, by a script that
    names `tf.keras` (`script_uses_tf_keras`): tf.keras-era code that Keras 3
    refuses as it is built (a TensorFlow op on a Keras layer's output, say)."""
    error = error or {}
    return not trained and error.get("raised_in_keras3") is True \
        and error.get("script_uses_tf_keras") is True


def switched(generation: int, failure: Failure) -> dict[str, Any]:
    """The `keras_switched` record: event fields and the summary's entry."""
    return {"generation": generation, "from": "keras3", "to": "tf_keras",
            "task": failure.task, "why": failure.reason}


def under_tf_keras(plan: Plan) -> Plan:
    """`plan` with every task under tf_keras."""
    return plan.with_task_env(TF_KERAS_ENV)
