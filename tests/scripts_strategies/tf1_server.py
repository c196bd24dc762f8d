"""An unmodified TF1-style between-graph script of the old Keras days.

It builds its own `tf.train.Server` from TF_CONFIG, joins it on ps tasks (which
never return), places variables on the ps with `replica_device_setter` and sets
the Keras session itself with `K.set_session`. Nothing here knows about
mgpu-launch. Prints `RESULT {...}` on workers.

    tf1_server.py [--dir CKPT_DIR] [--epochs 2] [--batch-s 0]

With `--dir`, it resumes as TensorFlow's graph-mode message says (BackupAndRestore
refuses graph mode): worker 0 saves with `ModelCheckpoint(save_weights_only=True)`
in that directory at each epoch's end; each worker loads the latest with
`load_weights` and starts `fit` at `initial_epoch` (`RESUME epoch=E`).
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.compat.v1.keras import backend as K  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--dir", default="")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-s", type=float, default=0.0)  # a pause after each batch
args = parser.parse_args()

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

initial_epoch, callbacks = 0, []
if args.dir:
    latest = tf.train.latest_checkpoint(args.dir)
    if latest:
        model.load_weights(latest)
        initial_epoch = int(latest.rsplit("-", 1)[1])
        print(f"RESUME epoch={initial_epoch}", flush=True)
    if index == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(args.dir, "weights-{epoch:03d}"), save_weights_only=True))
if args.batch_s:
    callbacks.append(tf.keras.callbacks.LambdaCallback(
        on_batch_end=lambda batch, logs: time.sleep(args.batch_s)))
rng = np.random.default_rng(index)
x = rng.normal(size=(128, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
history = model.fit(x, y, epochs=args.epochs, initial_epoch=initial_epoch, batch_size=16,
                    verbose=2, callbacks=callbacks)
devices = sorted({v.device for v in model.weights})
print("RESULT " + json.dumps({"loss": [float(v) for v in history.history["loss"]],
                              "variable_devices": devices}), flush=True)
