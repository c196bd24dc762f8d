"""A synchronous job that trains steadily until the launcher stops it (the
straggler radar's tests): MultiWorkerMirroredStrategy, tf_keras `fit`, no
runtime call (steps are counted from the optimizer).

Options, each for one task only (`TASK:VALUE`, the task as `worker1`):
  --slow-input worker1:0.05   that task's tf.data map sleeps 0.05 s per batch
                              (an I/O-like wait: a slow disk or share)
  --pin worker1:0,worker0:1   each task named runs on that CPU only (the test
                              puts other processes on worker1's: a noisy neighbour)
For every task:
  --epoch-steps N             epochs of N steps, each ending with an evaluation
                              and a BackupAndRestore save into --backup DIR; each
                              task prints the step it begins at ("worker1 begins
                              at step 80": a restarted job's restored checkpoint)
"""

import argparse
import json
import os
import time

os.environ["TF_USE_LEGACY_KERAS"] = "1"

parser = argparse.ArgumentParser()
parser.add_argument("--slow-input", default="")
parser.add_argument("--pin", default="")
parser.add_argument("--steps", type=int, default=100_000)
parser.add_argument("--epoch-steps", type=int, default=0)
parser.add_argument("--backup", default="")
args = parser.parse_args()

config = json.loads(os.environ["TF_CONFIG"])
me = f"{config['task']['type']}{config['task']['index']}"
workers = len(config["cluster"]["worker"])


def for_me(option: str) -> str | None:
    """The value of TASK:VALUE for this task (several: TASK:VALUE,TASK:VALUE)."""
    for entry in option.split(","):
        task, _, value = entry.partition(":")
        if task == me:
            return value
    return None


pin = for_me(args.pin)
if pin is not None:  # before TensorFlow starts a thread: every later one inherits it
    cpus = {int(pin)}
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 64)).astype("float32")
y = (x @ rng.normal(size=(64, 1)) > 0).astype("float32")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64 * workers)
delay = for_me(args.slow_input)
if delay is not None:
    def _wait(batch):
        time.sleep(float(delay))
        return batch

    dataset = dataset.map(lambda a, b: (tf.numpy_function(_wait, [a], tf.float32), b))
    dataset = dataset.map(lambda a, b: (tf.ensure_shape(a, [None, 64]), b))

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(64,)),
        tf.keras.layers.Dense(512, activation="relu"),
        tf.keras.layers.Dense(512, activation="relu"),
        tf.keras.layers.Dense(1),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.01),
                  loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
print(f"{me} training", flush=True)
if args.epoch_steps:
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup)
    began = tf.keras.callbacks.LambdaCallback(on_train_begin=lambda logs: print(
        f"{me} begins at step {int(model.optimizer.iterations.numpy())}", flush=True))
    model.fit(dataset, epochs=args.steps // args.epoch_steps, steps_per_epoch=args.epoch_steps,
              validation_data=dataset, validation_steps=20, callbacks=[backup, began],
              verbose=0)
else:
    model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0)
