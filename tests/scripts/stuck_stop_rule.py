"""A stopping rule that looks at each worker's own numbers (a common mistake).

tf.keras (TF_USE_LEGACY_KERAS=1), MultiWorkerMirroredStrategy; a callback
stops training once this worker has seen its own shard once (its length
differs per worker), so worker1 leaves fit() three steps before worker0 does.
Knows nothing of mgpu-launch.
"""

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()

examples = (40 - 3 * index) * 8  # this worker's own shard
rng = np.random.default_rng(index)
x = rng.normal(size=(examples, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8)


class OnePass(tf.keras.callbacks.Callback):
    """Stop once this worker's shard was seen once."""

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 >= examples // 8:
            self.model.stop_training = True


with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(dataset, epochs=1, steps_per_epoch=100, callbacks=[OnePass()], verbose=2)
print("DONE")
