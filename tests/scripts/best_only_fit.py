"""A Keras `fit` with `ModelCheckpoint(save_best_only=True)` on a metric that
cannot improve: a callback logs `plateau` = 1.0 at every epoch's end (a
validation metric stuck at its value). No mgpu-launch calls.

argv: the checkpoint folder; the Keras (`tf_keras`, or `keras`: Keras 3 on
TensorFlow); `once` (nothing to beat at first: the first epoch writes, no
other) or `never` (`initial_value_threshold=1.0`, the best of an earlier run:
no epoch writes); `weights` (save_weights_only, a .weights.h5 file) or `model`
(Model.save, a .keras file). 3 epochs of 8 steps; under several workers
(TF_CONFIG) MultiWorkerMirroredStrategy. Prints `CHECKED <epoch>` after each
epoch's checkpoint callback. KILL_AFTER_EPOCH=E: the last worker kills itself
(SIGKILL) right after epoch E's checkpoint callback, in every generation (a
crash loop).
"""

import json
import os
import signal
import sys

import numpy as np

folder, flavor, when, what = sys.argv[1:5]
if flavor == "tf_keras":
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tensorflow as tf

    keras = tf.keras
else:
    import keras
    import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
me = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 \
    else tf.distribute.get_strategy()

x = np.random.default_rng(0).normal(size=(64 * workers, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")


class Plateau(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        logs["plateau"] = 1.0  # the same value every epoch: never an improvement


class Checked(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        print("CHECKED", epoch, flush=True)
        if os.environ.get("KILL_AFTER_EPOCH") == str(epoch) and me == workers - 1:
            os.kill(os.getpid(), signal.SIGKILL)


name = "best.weights.h5" if what == "weights" else "best.keras"
extra = {"initial_value_threshold": 1.0} if when == "never" else {}
best = keras.callbacks.ModelCheckpoint(
    os.path.join(folder, name), monitor="plateau", mode="min", save_best_only=True,
    save_weights_only=what == "weights", **extra)
model.fit(x, y, batch_size=8 * workers, epochs=3, verbose=0,
          callbacks=[Plateau(), best, Checked()])
print("TRAINED", flush=True)
