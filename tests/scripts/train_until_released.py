"""TensorFlow's multi-worker Keras tutorial, trained until a release file exists.

Knows nothing of mgpu-launch (steps are counted off the optimizer); for tests
that act on a job while it trains (`mgpu-launch profile`). Never outlives a
broken test: it stops after 120 s.
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

release = Path(sys.argv[1])
deadline = time.monotonic() + 120
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype("float32")
y = (x @ rng.normal(size=(16, 1)) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32 * num_workers)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(16,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))


class UntilReleased(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if release.exists() or time.monotonic() > deadline:
            self.model.stop_training = True


model.fit(dataset, epochs=1, steps_per_epoch=1_000_000, callbacks=[UntilReleased()], verbose=0)
print("released", flush=True)
