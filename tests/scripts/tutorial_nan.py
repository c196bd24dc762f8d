"""A tutorial-shaped Keras `fit` whose input holds one bad batch; knows nothing of mgpu-launch.

Its own `BackupAndRestore(backup_dir=argv[1])` (a save each epoch), no runtime
calls, `tf.keras` as the default Keras resolves it (`keras: tf_keras` or
`keras3` in the cluster file picks). 6 epochs of 40 steps of a small
regression (mean squared error). Worker 1's copy of the input holds values of
1e30 in its 100th batch (POISON_AT_STEP=N moves it, N,M,... poisons each, 0:
none; POISON_WORKER=I
poisons worker I's instead; POISON_VALUE=V puts V there instead, e.g. a
finite 30 for a loss spike): at step 100, that worker's loss is inf, its
gradient reaches every worker's weights at the all-reduce and every later step
is NaN. A restart from an earlier save starts the input again from its first
batch where the input's position is not carried (Keras 3), so the bad batch
comes back at another step; under tf_keras the launcher carries it
(runtime/epochinput.py): the same batch at the same step. POISON_ONCE=1
poisons generation 0 only (a one-off fault: MGPU_GENERATION). POISON_BY=step
makes it come back at the same step whatever the Keras: the
weights of the first layer are set to 1e30 just before the optimizer's step
POISON_AT_STEP, on every worker (the bad state of a step, not a batch).
POISON_BY=stats puts a BatchNormalization after the first layer and makes
its moving variance NaN there instead: the weights go bad, the loss (which
training computes from the batch's own statistics) stays finite.
INPUT=repeat makes the input one stream over the epochs (`repeat()`), a
position Keras 3 carries too. Worker 0 prints `EPOCH_BATCHES <generation>
<epoch> <n>` at each epoch's end (the batches it trained in it) and
`WEIGHTS_FINITE <True|False>` at the end.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
worker = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy()

STEPS, EPOCHS = 40, 6
generation = os.environ.get("MGPU_GENERATION", "0")
poison_at = [int(s) for s in os.environ.get("POISON_AT_STEP", "100").split(",") if int(s) > 0]
if os.environ.get("POISON_ONCE") == "1" and generation != "0":
    poison_at = []  # a one-off fault: the replay's input is clean
poisoned = int(os.environ.get("POISON_WORKER", "1"))
rng = np.random.default_rng(0)
batch = 16 * num_workers  # the global batch: 16 a worker
x = rng.normal(size=(STEPS * EPOCHS * batch, 8)).astype("float32")
y = x.sum(axis=-1, keepdims=True) * 0.5
by_step = os.environ.get("POISON_BY") in ("step", "stats")
by_stats = os.environ.get("POISON_BY") == "stats"
# A bad batch: the poison_at-th step of the run.
for step in poison_at if worker == poisoned and not by_step else ():
    x[(step - 1) * batch:step * batch] = float(os.environ.get("POISON_VALUE", "1e30"))
# Sharded by data, as TensorFlow shards it: step k gets worker w's half of batch k - 1.
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
if os.environ.get("INPUT") == "repeat":  # one stream over the epochs (Keras 3 carries it)
    dataset = dataset.repeat()

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8,)),
        tf.keras.layers.Dense(8, activation="relu"),
        *([tf.keras.layers.BatchNormalization()] if by_stats else []),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")



class PoisonAtStep(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) + 1 in poison_at and by_stats:
            variance = self.model.layers[1].moving_variance
            variance.assign(tf.fill(variance.shape, float("nan")))
        elif int(self.model.optimizer.iterations.numpy()) + 1 in poison_at:
            kernel = self.model.layers[0].kernel
            kernel.assign(tf.fill(kernel.shape, 1e30))


class CountBatches(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.trained = 0

    def on_train_batch_end(self, batch, logs=None):
        self.trained += 1

    def on_epoch_end(self, epoch, logs=None):
        if worker == 0:
            print("EPOCH_BATCHES", generation, epoch, self.trained, flush=True)


backup_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/backup"
model.fit(dataset, epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
          callbacks=[tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
                     CountBatches(), *([PoisonAtStep()] if by_step else [])])
finite = all(bool(np.isfinite(w).all()) for w in model.get_weights())
print("WEIGHTS_FINITE", finite, flush=True)
