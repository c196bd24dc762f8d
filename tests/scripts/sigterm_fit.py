"""A tutorial-shaped MWMS `fit` (tf.keras, no runtime calls) that trains until
it is stopped. With OWN_HANDLER=1 it sets its own SIGTERM handler before it
creates the strategy (as scripts that clean up at a stop do): the handler
writes `<dir>/handled-<task index>` and exits 0.

    sigterm_fit.py DIR
"""

import json
import os
import signal
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

folder = sys.argv[1]
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def cleanup(signum, frame):
    with open(os.path.join(folder, f"handled-{index}"), "w") as handle:
        handle.write(f"signal {signum}\n")
    sys.exit(0)


if os.environ.get("OWN_HANDLER") == "1":
    signal.signal(signal.SIGTERM, cleanup)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(dataset, epochs=100_000, steps_per_epoch=20, verbose=2)
