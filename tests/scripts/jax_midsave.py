"""Keras 3 on JAX in one process, knows nothing of mgpu-launch: 16 samples in
8 batches of 2 an epoch, 2 epochs, `BackupAndRestore(backup_dir=argv[1],
save_freq=3)`; argv[2]: fit's `shuffle` (true | false); argv[3]: raise at the
start of that step of this run (epoch x 8 + batch; -1: none). Prints
`BATCH <epoch> <batch>` as each step begins, `DONE` at the end. PLAIN=1: a
`fit` with no callback of its own."""

import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

backup, shuffle, stop = sys.argv[1], sys.argv[2] == "true", int(sys.argv[3])
keras.utils.set_random_seed(0)
x = np.arange(16, dtype="float32").reshape(16, 1)
model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")


class Steps(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.epoch * 8 + batch == stop:
            raise SystemExit(3)  # interrupted: the backup stays
        print("BATCH", self.epoch, batch, flush=True)


if os.environ.get("PLAIN") == "1":  # no callback of its own: the launcher's only
    model.fit(x, x, batch_size=2, epochs=2, shuffle=shuffle, verbose=0)
else:
    model.fit(x, x, batch_size=2, epochs=2, shuffle=shuffle, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=3), Steps()])
print("DONE", flush=True)
