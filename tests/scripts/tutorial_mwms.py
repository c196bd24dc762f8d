"""TensorFlow's multi-worker Keras tutorial, condensed; knows nothing of mgpu-launch.

Reads TF_CONFIG itself, uses tf.keras with TF_USE_LEGACY_KERAS=1 and
BackupAndRestore, and prints a checksum of its final weights.
"""

import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 16)).astype("float32")
y = (x @ rng.normal(size=(16, 1)) > 0).astype("float32")
per_worker_batch = 32
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=1).repeat()
dataset = dataset.batch(per_worker_batch * num_workers)

with strategy.scope():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(16,)),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))

backup_dir = os.path.join(sys.argv[1] if len(sys.argv) > 1 else "/tmp", "backup")
callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir)]
model.fit(dataset, epochs=3, steps_per_epoch=10, callbacks=callbacks, verbose=2)
checksum = float(sum(np.abs(w).sum() for w in model.get_weights()))
print(f"WEIGHTS_CHECKSUM {checksum:.6f}")
