"""A runtime script: `runtime.strategy()` (logical CPU devices from MGPU_CPU_DEVICES or
--cpu-devices), tf.keras fit, runtime callbacks and save_model.

Prints `RESULT {"weights": <sha256>, "replicas": N, ...}` for the tests.
"""

import argparse
import hashlib
import json

import numpy as np
import tensorflow as tf

from launcher import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--cpu-devices", type=int, default=None)
parser.add_argument("--save", default="")
parser.add_argument("--keras3", action="store_true", help="build the model with Keras 3")
args = parser.parse_args()

strategy = runtime.strategy(cpu_devices=args.cpu_devices)
if args.keras3:
    import keras
else:
    keras = tf.keras
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1))).astype("float32")
global_batch = 8 * strategy.num_replicas_in_sync
dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).repeat()

with strategy.scope():
    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden), name="regressor")
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(dataset, epochs=2, steps_per_epoch=4, verbose=2,
                    callbacks=runtime.callbacks(model=model))
digest = hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights()))
devices = [d for d in strategy.extended.worker_devices]
print("RESULT " + json.dumps({
    "weights": digest.hexdigest(),
    "loss": [round(float(v), 6) for v in history.history["loss"]],
    "replicas": strategy.num_replicas_in_sync,
    "local_devices": devices,
    "chief": runtime.is_chief(),
    "layers": [[type(layer).__name__, layer.name] for layer in model.layers],
}), flush=True)
if args.save:
    runtime.save_model(model, args.save)
