"""A one-process Keras `fit` with its own BackupAndRestore (argv[1]), under the
Keras argv[2] names (`tf_keras`, or `keras`: Keras 3 on KERAS_BACKEND); no
mgpu-launch calls. 4 epochs of 16 steps; exits 3 at the end of the epoch
CRASH_AT names (after the backup saved it), or, in the first generation, right
after the step CRASH_AT_STEP names. Prints `STEPS_DONE <optimizer steps>` at the end."""

import os
import sys

import numpy as np

if sys.argv[2] == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    keras = tf.keras
else:
    import keras

x = np.random.default_rng(0).normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")


class Crash(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if os.environ.get("CRASH_AT") == str(epoch):
            os._exit(3)

    def on_train_batch_end(self, batch, logs=None):
        at = os.environ.get("CRASH_AT_STEP")
        if at and os.environ.get("MGPU_GENERATION", "0") == "0" \
                and int(self.model.optimizer.iterations.numpy()) == int(at):
            os._exit(3)


model.fit(x, y, batch_size=8, epochs=4, verbose=0,
          callbacks=[keras.callbacks.BackupAndRestore(backup_dir=sys.argv[1]), Crash()])
print("STEPS_DONE", int(model.optimizer.iterations.numpy()), flush=True)
print("TRAINED", flush=True)
