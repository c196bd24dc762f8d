"""A tutorial-shaped Keras `fit` with a learning-rate warmup; knows nothing of mgpu-launch.

A small classifier on synthetic data (TensorFlow's tutorials' shape: a
`Sequential`, `compile`, `fit` over a repeated, shuffled dataset), Adam with a
linear warmup from 0 to 0.01 over the first 100 steps, then constant: the
loss moves most, up and down, while the rate climbs. 5 epochs of 60 steps.
Used to check that a healthy run has no loss spike (runtime/spikes.py).
"""

import json
import os

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
strategy = tf.distribute.MultiWorkerMirroredStrategy()

STEPS, EPOCHS, WARMUP, PEAK = 60, 5, 100, 0.01
rng = np.random.default_rng(0)
x = rng.normal(size=(4096, 20)).astype("float32")
y = (x @ rng.normal(size=(20, 4))).argmax(axis=-1).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096, seed=1).repeat()
dataset = dataset.batch(32 * num_workers)


class Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
        return PEAK * tf.minimum(1.0, tf.cast(step + 1, tf.float32) / WARMUP)

    def get_config(self):
        return {}


with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(20,)),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(64, activation="relu"),
        tf.keras.layers.Dense(4),
    ])
    model.compile(optimizer=tf.keras.optimizers.Adam(Warmup()),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

history = model.fit(dataset, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
print("FINAL_LOSS", round(float(history.history["loss"][-1]), 4), flush=True)
