"""tf_keras `fit` (KERAS=3: Keras 3's) of a reshuffled dataset with a mid-epoch BackupAndRestore;
knows nothing of mgpu-launch. Records which sample ids each training step saw.

argv: BACKUP_DIR IDS_DIR. The dataset yields 64 samples whose first feature
is the sample's id (the model never sees it), 8 steps an epoch of a global
batch of 8, 3 epochs, shuffled each epoch: by `shuffle(64, seed=7,
reshuffle_each_iteration=True)`; with INPUT=repeated, that shuffle
`repeat()`ed and `steps_per_epoch=8` (one stream over the epochs); with
INPUT=generator, by a Python generator (a new numpy permutation each epoch,
whose position a restart cannot carry; `assert_cardinality` gives its
length); with INPUT=unknown, the seeded shuffle through a `filter` (a length
Keras cannot know, no steps_per_epoch).
`BackupAndRestore(save_freq=SAVE_FREQ)` (default: epoch). Each worker appends
`{"step": S, "ids": [...]}` per step to
IDS_DIR/g<generation>-w<index>.jsonl (the ids its replica trained at the
optimizer's step S). KILL_AT_STEP=S: in the first generation, worker 1 kills
itself (SIGKILL) right after step S; HOLD_AT_STEP=S: it stops there instead
(sleeps until killed: the test loses its host), so the other worker waits in
step S+1's all-reduce and no later step reaches the weights.
"""

import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

if os.environ.get("KERAS") == "3":
    import keras
else:
    import tf_keras as keras

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
index = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy()


def sample(i):
    x = tf.stack([tf.cast(i, tf.float32), tf.sin(tf.cast(i, tf.float32))])
    return x, tf.cast(i % 2, tf.float32)[None]


rng = np.random.default_rng(7)


def permutation():
    yield from rng.permutation(64)


if os.environ.get("INPUT") == "generator":
    ids = tf.data.Dataset.from_generator(permutation, output_signature=tf.TensorSpec([], tf.int64))
    ids = ids.apply(tf.data.experimental.assert_cardinality(64))
else:
    ids = tf.data.Dataset.range(64).shuffle(64, seed=7, reshuffle_each_iteration=True)
    ids = ids.repeat() if os.environ.get("INPUT") == "repeated" else ids
if os.environ.get("INPUT") == "unknown":  # a length Keras cannot know (a filter)
    ids = ids.filter(lambda i: True)
dataset = ids.map(sample).batch(8)
seen: list[int] = []


def record(ids):
    seen.extend(int(i) for i in ids.numpy())
    return 0


class Model(keras.Model):
    def train_step(self, data):
        x, _ = data
        done = tf.py_function(record, [tf.cast(x[:, 0], tf.int64)], tf.int32)
        with tf.control_dependencies([done]):
            return super().train_step(data)


with strategy.scope():
    inputs = keras.layers.Input(shape=(2,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs[:, 1:])  # not the id
    model = Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.SGD(0.05),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))

ids_path = os.path.join(sys.argv[2], f"g{os.environ.get('MGPU_GENERATION', '0')}-w{index}.jsonl")


class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        with open(ids_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, "ids": seen[:]}) + "\n")
        seen.clear()
        at = os.environ.get("KILL_AT_STEP")
        if at and os.environ.get("MGPU_GENERATION") == "0" and index == 1 and step == int(at):
            os.kill(os.getpid(), signal.SIGKILL)
        at = os.environ.get("HOLD_AT_STEP")
        if at and os.environ.get("MGPU_GENERATION") == "0" and index == 1 and step == int(at):
            while True:  # until its host is lost (the test kills that host's agent)
                signal.pause()


save_freq = os.environ.get("SAVE_FREQ", "epoch")
backup = keras.callbacks.BackupAndRestore(
    sys.argv[1], save_freq=save_freq if save_freq == "epoch" else int(save_freq))
steps = 8 if os.environ.get("INPUT") == "repeated" else None
model.fit(dataset, epochs=3, steps_per_epoch=steps, verbose=0, callbacks=[backup, Record()])
print("STEPS_DONE", int(model.optimizer.iterations.numpy()), flush=True)
