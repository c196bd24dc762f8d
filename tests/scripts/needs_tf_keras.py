"""A tf_keras (Keras 2) script: `tf.keras.optimizers.legacy`, which Keras 3 refuses.

Knows nothing of mgpu-launch. Under Keras 3 (TensorFlow 2.16+'s default for
`tf.keras`) it fails at the optimizer; under `TF_USE_LEGACY_KERAS=1` it trains.
"""

import numpy as np
import tensorflow as tf

model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.legacy.Adam(1e-3), loss="mse")
x = np.ones((32, 4), "float32")
model.fit(x, x[:, :1], epochs=1, verbose=0)
print("TRAINED", flush=True)
