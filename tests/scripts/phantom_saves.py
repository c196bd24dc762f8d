"""tf_keras `fit` on arrays it shuffles itself (an input a restart cannot continue
mid-epoch) with runtime.callbacks(save_freq=3): tests/test_epochinput.py."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tf_keras as keras

from launcher import runtime

x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0,  # fit shuffles arrays: not carried
          callbacks=runtime.callbacks(save_freq=3, model=model))
