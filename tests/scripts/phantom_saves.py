"""`fit` on arrays it shuffles itself (an input a restart cannot continue
mid-epoch) with runtime.callbacks(save_freq=3): tf_keras, or Keras 3 on
TensorFlow with the argument `keras3`: tests/test_epochinput.py."""

import os
import sys

if sys.argv[1:] == ["keras3"]:
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras
else:
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import tf_keras as keras
import numpy as np

from launcher import runtime

x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0,  # fit shuffles arrays: not carried
          callbacks=runtime.callbacks(save_freq=3, model=model))
