"""The shape Keras 3's distribution guide teaches, on JAX across processes;
knows nothing of mgpu-launch.

`keras.distribution.initialize()` (from the cluster's KERAS_DISTRIBUTION_*
variables), a `DataParallel` over every process's devices, each process
training on its share of the arrays, and `model.fit(..., callbacks=
[BackupAndRestore(backup_dir=argv[1])])` with the script's own directory.
4 epochs of 20 steps in order (`shuffle=False`: an uninterrupted run's weights
are the reference), 0.02 s a step. KILL_AT_STEP=S: in the first generation,
process 1 kills itself (SIGKILL) right after step S; RAISE_AT_STEP=S: process 0
raises a ValueError there (an error in the script). Prints `STEPS_DONE
<optimizer steps>` and `WEIGHTS <checksum>` at the end.
"""

import os
import signal
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

keras.distribution.initialize()
process = int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0"))
count = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
keras.distribution.set_distribution(keras.distribution.DataParallel(
    devices=keras.distribution.list_devices(), auto_shard_dataset=False))

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(320, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
x, y = x[process::count], y[process::count]  # this process's share
model = keras.Sequential([keras.layers.Input((8,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")


class StepTime(keras.callbacks.Callback):
    """A real model's step time (0.02 s)."""

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.02)
        if process == 0 and int(self.model.optimizer.iterations) == int(
                os.environ.get("RAISE_AT_STEP") or -1):
            raise ValueError(f"bad data at step {int(self.model.optimizer.iterations)}")
        at = os.environ.get("KILL_AT_STEP")
        if at and process == 1 and os.environ.get("MGPU_GENERATION") == "0" \
                and int(self.model.optimizer.iterations) == int(at):
            os.kill(os.getpid(), signal.SIGKILL)


model.fit(x, y, batch_size=len(x) // 20, epochs=4, verbose=0, shuffle=False,
          callbacks=[keras.callbacks.BackupAndRestore(backup_dir=sys.argv[1]), StepTime()])
print("STEPS_DONE", int(model.optimizer.iterations), flush=True)
print("WEIGHTS", f"{sum(float(np.sum(w)) for w in model.get_weights()):.6f}", flush=True)
