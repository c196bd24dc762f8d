"""The shape of TF's "Custom training loop with Keras and MultiWorkerMirroredStrategy"
tutorial, with its own `tf.train.CheckpointManager`; knows nothing of mgpu-launch.

The chief saves into the checkpoint directory (argv[1]), the other workers into
a temporary one deleted at once, as the tutorial does; every worker restores
with `restore_or_initialize()`. 6 epochs of 20 steps at 0.05 s a step, a save
at each epoch's end; prints `EPOCH n` as each epoch starts and
`WEIGHTS_FINITE <True|False>` at the end. POISON_AT_STEP=N makes worker 1's
output bias NaN before step N (a flipped bit; the all-reduce spreads it), in
generation 0 only (MGPU_GENERATION): nothing reads this loop's loss.
SAVE_WITH=checkpoint saves with `checkpoint.save(prefix)` and restores
`tf.train.latest_checkpoint` instead of the manager (the other common shape).
"""

import json
import os
import shutil
import sys
import time

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
task = tf_config.get("task", {})
is_chief = task.get("type", "worker") == "worker" and task.get("index", 0) == 0
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = 16 * strategy.num_replicas_in_sync
steps_per_epoch = 20

x = np.random.default_rng(0).random((64, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)

checkpoint_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/ckpt"
write_dir = checkpoint_dir if is_chief else os.path.join(checkpoint_dir,
                                                         f"workertemp_{task.get('index')}")
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, directory=checkpoint_dir, max_to_keep=2)
write_manager = manager if is_chief else tf.train.CheckpointManager(
    checkpoint, directory=write_dir, max_to_keep=1)
by_checkpoint = os.environ.get("SAVE_WITH") == "checkpoint"
if by_checkpoint:
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
else:
    manager.restore_or_initialize()


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            per_example = tf.keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(step_fn, args=(next(iterator),)), axis=None)


poison_at = int(os.environ.get("POISON_AT_STEP", "0"))
if task.get("index", 0) != 1 or os.environ.get("MGPU_GENERATION", "0") != "0":
    poison_at = 0
iterator = iter(dist_dataset)
while int(optimizer.iterations.numpy()) < 6 * steps_per_epoch:
    print(f"EPOCH {int(optimizer.iterations.numpy()) // steps_per_epoch}", flush=True)
    for _ in range(steps_per_epoch):
        if int(optimizer.iterations.numpy()) + 1 == poison_at:
            bias = model.trainable_variables[-1]
            bias.assign(tf.fill(bias.shape, float("nan")))
        train_step(iterator)
        time.sleep(0.05)
    if by_checkpoint:
        os.makedirs(write_dir, exist_ok=True)
        checkpoint.save(os.path.join(write_dir, "ckpt"))
    else:
        write_manager.save()
    if not is_chief:
        shutil.rmtree(write_dir, ignore_errors=True)
print("WEIGHTS_FINITE", all(bool(np.isfinite(w).all()) for w in model.get_weights()),
      flush=True)
print("TRAINED", flush=True)
