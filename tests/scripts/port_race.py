"""Generation 0's worker 0 takes its own TF_CONFIG port before TensorFlow binds
it (the race between the launcher's plan and TF's bind: something else listens
there); every other task, and every later generation, forms the cluster and
all-reduces once."""

import json
import os
import socket

config = json.loads(os.environ["TF_CONFIG"])
index = config["task"]["index"]
if index == 0 and os.environ.get("MGPU_GENERATION") == "0":
    port = int(config["cluster"]["worker"][0].rsplit(":", 1)[1])
    holder = socket.socket()
    holder.bind(("", port))
    holder.listen()
    print(f"worker 0 holds its own port {port}", flush=True)

import tensorflow as tf  # noqa: E402 - after the port is held

strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce(tf.distribute.ReduceOp.SUM,
                        strategy.run(lambda: tf.constant(1.0)), axis=None)
print(f"all-reduced {float(total):g} over {strategy.num_replicas_in_sync} replicas", flush=True)
