"""Each worker computes steps_per_epoch from its own shard (a common mistake).

tf.keras (TF_USE_LEGACY_KERAS=1), MultiWorkerMirroredStrategy, each worker
reads its own list of examples and repeats it; steps_per_epoch is that list's
length over the batch size, so worker1 runs 3 steps an epoch fewer. After
training every worker writes its results for a while. Knows nothing of
mgpu-launch.
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

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(dataset, epochs=2, steps_per_epoch=examples // 8, verbose=2)
print("DONE")
