"""A tiny tf_keras MWMS job for fault tests: ~1 s epochs, resumable, prints a weights checksum.

    fault_train.py [--epochs 6] [--steps 10] [--step-s 0.1] [--preemption]

Uses `launcher.runtime`: its strategy and its callbacks (BackupAndRestore in
MGPU_CHECKPOINT_DIR, progress reports with the epoch). Prints
`RESTORED step=S` when training
begins, `BEGIN gen=G epoch=E` at each epoch start and `WEIGHTS_CHECKSUM x` at the end.

`--preemption` asks the runtime to save on SIGTERM (`callbacks(save_on_sigterm=True)`:
TensorFlow's `PreemptionCheckpointHandler`): every worker saves at the same
step, then exits 42.
"""

import argparse
import os
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from launcher import runtime  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--step-s", type=float, default=0.1)
parser.add_argument("--preemption", action="store_true")
args = parser.parse_args()
generation = os.environ.get("MGPU_GENERATION", "0")

tf.keras.utils.set_random_seed(0)
strategy = runtime.strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16 * runtime.num_workers())
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8,)),
        tf.keras.layers.Dense(8, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))


class Pace(tf.keras.callbacks.Callback):
    """Makes each step last `step_s` (an epoch ~1 s) and says where training is."""

    def on_train_begin(self, logs=None):
        # After BackupAndRestore's on_train_begin: the step the job resumes at.
        print(f"RESTORED step={int(self.model._train_counter.numpy())}", flush=True)

    def on_epoch_begin(self, epoch, logs=None):
        print(f"BEGIN gen={generation} epoch={epoch}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(args.step_s)


callbacks = runtime.callbacks(save_on_sigterm=args.preemption)
model.fit(dataset, epochs=args.epochs, steps_per_epoch=args.steps,
          callbacks=[*callbacks, Pace()], verbose=0)
checksum = float(sum(np.abs(w).sum() for w in model.get_weights()))
print(f"WEIGHTS_CHECKSUM {checksum:.6f}", flush=True)
