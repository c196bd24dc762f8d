"""The shape TensorFlow's multi-worker Keras tutorial teaches; knows nothing of mgpu-launch.

`model.fit(..., callbacks=[BackupAndRestore(backup_dir=...)])` with its own
backup directory (argv[1]; `per-host` as argv[2]: a folder of its own per
worker, as `/tmp/backup` is on each host of a real cluster), no runtime calls,
`tf.keras` as the default Keras resolves it. 6 epochs of 40 steps, 0.05 s a step.
KILL_AT_STEP=S: in the first generation, worker 1 kills itself (SIGKILL) right
after step S (a test's fault). Prints `STEPS_DONE <optimizer steps>` at the end.
"""

import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
strategy = tf.distribute.MultiWorkerMirroredStrategy()

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16 * num_workers)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))

backup_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/backup"
if sys.argv[2:] == ["per-host"]:
    backup_dir = os.path.join(backup_dir, f"host{tf_config.get('task', {}).get('index', 0)}")


class StepTime(tf.keras.callbacks.Callback):
    """A real model's step time (0.05 s), so an epoch lasts 2 s."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.05)
        at = os.environ.get("KILL_AT_STEP")
        if at and os.environ.get("MGPU_GENERATION") == "0" \
                and tf_config.get("task", {}).get("index") == 1 \
                and int(self.model.optimizer.iterations.numpy()) == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


model.fit(dataset, epochs=6, steps_per_epoch=40, verbose=0,
          callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir), StepTime()])
print("STEPS_DONE", int(model.optimizer.iterations.numpy()), flush=True)
print("TRAINED", flush=True)
