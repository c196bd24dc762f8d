"""TF's MWMS fit tutorial shape with its own BackupAndRestore, then the
commonest mistake of scripts copied from one host: evaluate() on the chief only.
fit() deletes its backup when it ends, so every restart trains from step 0.
Knows nothing of mgpu-launch."""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

backup = sys.argv[1]
task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.normal(size=(640, 8)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                 tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", metrics=["accuracy"],
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
model.fit(dataset, epochs=2, steps_per_epoch=20, verbose=2,
          callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=backup)])
if task["index"] == 0:  # the bug: evaluation on the chief only
    model.evaluate(dataset, steps=10, verbose=2)
print("DONE")
