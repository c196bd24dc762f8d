"""TF's MultiWorkerMirroredStrategy custom-loop tutorial with its own
`tf.train.CheckpointManager` (as tutorial_ctl_checkpoint.py), sized by the
caller: argv[1] the checkpoint directory, argv[2] the hidden width (the
weights are about 2 x 512 x width float32), argv[3] the epochs (10 steps each,
a save at each epoch's end). Knows nothing of mgpu-launch.

KILL_AT=E: in the first generation, worker 1 kills itself (SIGKILL) right
after the save of epoch E. HOLD_AT=E: in the first generation, the chief
prints `HOLDING` after the save of epoch E and trains no more (a test then
takes its whole host away). WORKER_STATE=1: each worker's checkpoint also
holds a variable of its own (its index), so the workers' saves differ from
the chief's. Prints `SAVE <epoch> <seconds>` (how long each save
blocked the loop; SAVE_EVERY=N: every N epochs only, from the first, and the
last), `STEPS <epoch> <seconds a step>`, `RESTORE <seconds>` (the managers made and the
restore) and, on the chief at the end, `FINAL <sha256 of the weights>`.
"""

import hashlib
import json
import os
import shutil
import signal
import sys
import time

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
task = tf_config.get("task", {})
is_chief = task.get("type", "worker") == "worker" and task.get("index", 0) == 0
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = 16 * strategy.num_replicas_in_sync
steps_per_epoch, width, epochs = 10, int(sys.argv[2]), int(sys.argv[3])

x = np.random.default_rng(0).random((64, 512)).astype("float32")
y = (x.sum(axis=1) > 256).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
dist_dataset = strategy.experimental_distribute_dataset(dataset.with_options(options))

tf.keras.utils.set_random_seed(7)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((512,)),
                                 tf.keras.layers.Dense(width, activation="relu"),
                                 tf.keras.layers.Dense(512, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.01)

checkpoint_dir = sys.argv[1]
write_dir = checkpoint_dir if is_chief else os.path.join(checkpoint_dir,
                                                         f"workertemp_{task.get('index')}")
began = time.monotonic()
mine = {"worker_index": tf.Variable(float(task.get("index", 0)))} \
    if os.environ.get("WORKER_STATE") else {}
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, **mine)
manager = tf.train.CheckpointManager(checkpoint, directory=checkpoint_dir, max_to_keep=2)
write_manager = manager if is_chief else tf.train.CheckpointManager(
    checkpoint, directory=write_dir, max_to_keep=1)
manager.restore_or_initialize()
print(f"RESTORE {time.monotonic() - began:.3f}", flush=True)


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


iterator = iter(dist_dataset)
kill_at = int(os.environ.get("KILL_AT", "-1"))
save_every = int(os.environ.get("SAVE_EVERY", "1"))
while int(optimizer.iterations.numpy()) < epochs * steps_per_epoch:
    epoch = int(optimizer.iterations.numpy()) // steps_per_epoch
    print(f"EPOCH {epoch}", flush=True)
    began = time.monotonic()
    for _ in range(steps_per_epoch):
        train_step(iterator)
    print(f"STEPS {epoch} {(time.monotonic() - began) / steps_per_epoch:.4f}", flush=True)
    if epoch % save_every and epoch + 1 < epochs:
        continue  # SAVE_EVERY=N: a save every N epochs (and the last)
    began = time.monotonic()
    write_manager.save()
    if not is_chief:
        shutil.rmtree(write_dir, ignore_errors=True)
    print(f"SAVE {epoch} {time.monotonic() - began:.3f}", flush=True)
    if epoch == kill_at and not is_chief and os.environ.get("MGPU_GENERATION") == "0":
        os.kill(os.getpid(), signal.SIGKILL)
    if str(epoch) == os.environ.get("HOLD_AT") and is_chief \
            and os.environ.get("MGPU_GENERATION") == "0":
        print("HOLDING", flush=True)
        signal.pause()  # until the test takes the host away
if is_chief:
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.weights)).hexdigest()
    print(f"FINAL {digest}", flush=True)
print("TRAINED", flush=True)
