"""A new user's multi-worker script whose workers read files of different lengths.

tf.keras (TF_USE_LEGACY_KERAS=1), MultiWorkerMirroredStrategy, auto-sharding
off (each worker reads its own file), no steps_per_epoch: worker1 has 3 batches
fewer than worker0. Knows nothing of mgpu-launch.
"""

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()

batches = 40 - 3 * index  # the bug: this worker's shard is shorter
rng = np.random.default_rng(index)
x = rng.normal(size=(batches * 8, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
dataset = dataset.with_options(options)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd",
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(dataset, epochs=3, verbose=2)
print("DONE")
