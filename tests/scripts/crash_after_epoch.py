"""A small runtime-fit job that crashes once: generation 0 dies (exit 1) at the
end of epoch 1, after the backup saved it; the next generation resumes at
epoch 2 and trains to the end (4 epochs of 5 steps). tf_keras, one worker or more.
Prints `BEGIN gen=G epoch=E` at each epoch start and TRAINED at the end."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from launcher import runtime  # noqa: E402

generation = os.environ.get("MGPU_GENERATION", "0")
strategy = runtime.strategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8 * runtime.num_workers())
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
dataset = dataset.with_options(options)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")


class CrashOnce(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        print(f"BEGIN gen={generation} epoch={epoch}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        if generation == "0" and epoch == 1:  # after BackupAndRestore saved epoch 1
            print("CRASH", flush=True)
            os._exit(1)


model.fit(dataset, epochs=4, steps_per_epoch=5,
          callbacks=[*runtime.callbacks(), CrashOnce()], verbose=0)
print("TRAINED", flush=True)
