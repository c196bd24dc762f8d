"""An unmodified Keras 3 `fit` on JAX, no runtime call: 3 epochs of 40 steps,
each step slowed by 10 ms (a callback of the script's own) so that the step
counter is read many times inside each epoch."""

import os
import time

os.environ["KERAS_BACKEND"] = "jax"

import keras  # noqa: E402
import numpy as np  # noqa: E402


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.01)


x = np.random.default_rng(0).normal(size=(320, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[Slow()])
print("TRAINED", int(model.optimizer.iterations))
