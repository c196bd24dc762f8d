"""Keras `fit` in graph mode as the seed scripts ran it, on one process.

    graph_fit_checkpoint.py CKPT_DIR EPOCHS [saver]

tf_keras after `disable_eager_execution`, its session set with `K.set_session`,
a TF1 optimizer (Keras wraps it in a `TFOptimizer`); `ModelCheckpoint`
(`save_weights_only`) at each epoch's end, resumed with `load_weights` and
`initial_epoch` (BackupAndRestore refuses graph mode); with `saver`, a
`tf.compat.v1.train.Saver` of its own at each epoch's end instead (the graph
has no global step, the path no `-N`). 8 steps an epoch, a
short pause after each. Nothing of mgpu-launch. Prints `TRAINED N` (the
optimizer's count) at the end.
"""

import os
import sys
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.compat.v1.keras import backend as K  # noqa: E402

directory, epochs, saver = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["saver"]
tf.compat.v1.disable_eager_execution()
K.set_session(tf.compat.v1.Session())
model = tf.keras.Sequential([tf.keras.layers.Dense(4, input_shape=(4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.05), loss="mse")
initial_epoch = 0
latest = tf.train.latest_checkpoint(directory)
if latest:
    model.load_weights(latest)
    initial_epoch = int(latest.rsplit("-", 1)[1])
if saver:
    saver = tf.compat.v1.train.Saver()
    save = tf.keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: saver.save(
        K.get_session(), os.path.join(directory, "model.ckpt")))
else:
    save = tf.keras.callbacks.ModelCheckpoint(os.path.join(directory, "weights-{epoch:02d}"),
                                              save_weights_only=True)
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
model.fit(x, x.sum(axis=1, keepdims=True), epochs=epochs, initial_epoch=initial_epoch,
          batch_size=8, verbose=0, callbacks=[
              tf.keras.callbacks.LambdaCallback(on_batch_end=lambda batch, logs: time.sleep(0.03)),
              save])
print(f"TRAINED {K.get_value(model.optimizer.iterations)}", flush=True)
