"""A tf_keras `fit` with `runtime.callbacks(save_freq=1)`: a save every step.

argv[1]: the checkpoint directory (MGPU_CHECKPOINT_DIR). Each step sleeps
0.05 s (a callback), so a request the task polls for (every 0.2 s) lands
within a few steps. Prints WEIGHTS_FINITE at the end.
"""

import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ["MGPU_CHECKPOINT_DIR"] = sys.argv[1]

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from launcher import runtime  # noqa: E402

keras = tf.keras
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 4)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
model = keras.Sequential([keras.layers.Input(shape=(4,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.BinaryCrossentropy(from_logits=True))
slow = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: time.sleep(0.05))
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=4, verbose=0,
          callbacks=[*runtime.callbacks(save_freq=1, model=model), slow])
print("WEIGHTS_FINITE", bool(np.isfinite(model.get_weights()[0]).all()), flush=True)
