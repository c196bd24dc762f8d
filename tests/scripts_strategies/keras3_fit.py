"""An unmodified Keras 3 multi-worker script: `import keras`, MWMS, `model.fit`.

Nothing here knows about mgpu-launch. It prints `BEGIN gen=G epoch=E` at each
epoch start and one line the tests read:
`RESULT {"weights": <sha256 of the final weights>, "loss": ..., ...}`.

`--kill-at-epoch E`: in generation 0, worker 1 kills itself (SIGKILL) after the
first step of epoch E, once the chief has saved epoch E-1's backup (that step's
all-reduce needs the chief past its epoch-end save).
"""

import argparse
import hashlib
import inspect
import json
import os
import signal

import keras
import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--backup", default="")
parser.add_argument("--checkpoint", default="")
parser.add_argument("--save", default="")
parser.add_argument("--kill-at-epoch", type=int, default=-1)
args = parser.parse_args()
generation = os.environ.get("MGPU_GENERATION", "0")
task = os.environ.get("MGPU_TASK_TYPE", "?") + os.environ.get("MGPU_TASK_INDEX", "?")

strategy = tf.distribute.MultiWorkerMirroredStrategy()
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
batch = 16 * strategy.num_replicas_in_sync
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).repeat()

with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])



class Fault(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        print(f"BEGIN gen={generation} epoch={epoch}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch == args.kill_at_epoch and batch == 0 and generation == "0"
                and task == "worker1"):
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = []
if args.backup:
    callbacks.append(keras.callbacks.BackupAndRestore(args.backup, delete_checkpoint=False))
if args.checkpoint:
    callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))
callbacks.append(Fault())
history = model.fit(dataset, epochs=args.epochs, steps_per_epoch=8, callbacks=callbacks,
                    verbose=2)
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
print("RESULT " + json.dumps({
    "weights": digest.hexdigest(),
    "loss": [round(float(v), 6) for v in history.history["loss"]],
    "mae": [round(float(v), 6) for v in history.history["mae"]],
    "replicas": strategy.num_replicas_in_sync,
    "task": task,
    # Metric variables synchronized across workers (sync-on-read): Keras 3.4+;
    # Keras 3.3 logs each worker's own running mean.
    "synced_metrics": "synchronization" in inspect.signature(keras.Variable).parameters,
    "generation": generation,
}), flush=True)
if args.save:
    model.save(args.save) if strategy.extended.should_checkpoint else None
