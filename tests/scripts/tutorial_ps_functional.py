"""The model-building shape of TF's "Parameter server training" custom-loop
tutorial, written for tf.keras = Keras 2 (tf_keras); knows nothing of mgpu-launch.

Functional `tf.keras` code that applies a TensorFlow op (`tf.reduce_mean`) to a
Keras layer's output: under Keras 3 it dies as the model is built ("A KerasTensor
cannot be used as input to a TensorFlow function"), before any step; under
`TF_USE_LEGACY_KERAS=1` it trains 4 steps and prints TRAINED.
"""

import numpy as np
import tensorflow as tf

inputs = tf.keras.layers.Input(shape=(8,))
hidden = tf.keras.layers.Dense(16, activation="relu")(inputs)
pooled = tf.reduce_mean(hidden, axis=1, keepdims=True)  # a TF op on a KerasTensor
outputs = tf.keras.layers.Dense(1)(tf.concat([hidden, pooled], axis=1))
model = tf.keras.Model(inputs, outputs)
model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")

x = np.random.default_rng(0).random((64, 8)).astype("float32")
model.fit(x, x.sum(axis=1), batch_size=16, epochs=1, verbose=0)
print("TRAINED", flush=True)
