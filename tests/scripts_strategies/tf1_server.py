"""An unmodified TF1-style between-graph script of the old Keras days.

It builds its own `tf.train.Server` from TF_CONFIG, joins it on ps tasks (which
never return), places variables on the ps with `replica_device_setter` and sets
the Keras session itself with `K.set_session`. Nothing here knows about
mgpu-launch. Prints `RESULT {...}` on workers.
"""

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.compat.v1.keras import backend as K  # noqa: E402

tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(config["cluster"])
job, index = config["task"]["type"], config["task"]["index"]
server = tf.compat.v1.train.Server(cluster, job_name=job, task_index=index)
if job == "ps":
    server.join()

session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{index}"])
K.set_session(tf.compat.v1.Session(server.target, config=session_config))
with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{index}", cluster=cluster)):
    model = tf.keras.Sequential([tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
                                 tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.05), loss="mse")

rng = np.random.default_rng(index)
x = rng.normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
history = model.fit(x, y, epochs=2, batch_size=16, verbose=2)
devices = sorted({v.device for v in model.weights})
print("RESULT " + json.dumps({"loss": [float(v) for v in history.history["loss"]],
                              "variable_devices": devices}), flush=True)
