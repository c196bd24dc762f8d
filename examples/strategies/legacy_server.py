"""The TF1 between-graph pattern of old Keras code, with the runtime doing the plumbing.

Under mgpu-launch with `strategy: legacy_server` every task runs this script:
`runtime.legacy_session()` starts the task's `tf.compat.v1.train.Server` from
TF_CONFIG; on a ps task it serves until the launcher stops it, on a worker it
sets the Keras session (graph mode). Variables live on the ps tasks
(`replica_device_setter`); each worker trains asynchronously on its own data.

    mgpu-launch examples/strategies/legacy_server.yaml examples/strategies/legacy_server.py
"""

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras -> tf_keras

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from launcher import runtime  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    runtime.legacy_session()  # a ps task never returns from here
    with tf.compat.v1.device(runtime.legacy_device_setter()):
        model = tf.keras.Sequential([
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(8, activation="relu"),
            tf.keras.layers.Dense(1),
        ])
        model.compile(optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.05), loss="mse")

    rng = np.random.default_rng(runtime.task_index())  # each worker its own data
    x = rng.normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    history = model.fit(x, y, epochs=args.epochs, batch_size=16, verbose=2)
    print(f"worker {runtime.task_index()}: final loss {history.history['loss'][-1]:.4f}, "
          f"variables on {sorted({v.device for v in model.weights})}", flush=True)


if __name__ == "__main__":
    main()
