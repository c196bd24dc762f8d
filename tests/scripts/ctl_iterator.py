"""TF's custom-loop tutorial shape with its input's iterator in its checkpoint;
knows nothing of mgpu-launch. Records which sample ids each training step saw.

argv: CKPT_DIR IDS_DIR. 64 samples whose first feature is the sample's id (the
model never sees it), `shuffle(64, seed=7, reshuffle_each_iteration=True)`
`.repeat()`ed: one stream, 8 steps an epoch of a global batch of 8, 3
epochs. Each worker iterates its own shard (`shard(num_workers, index)` after
the shuffle) with a plain tf.data iterator, one replica a worker: TensorFlow
2.21 cannot put a distributed iterator in a checkpoint (SHARD=pipeline, the
tutorial's `distribute_datasets_from_function`, and SHARD=data,
`experimental_distribute_dataset`, raise "`Checkpoint` was expecting iterator
to be a trackable object").
`tf.train.Checkpoint(model, optimizer, iterator=iterator, epoch,
step_in_epoch)` saved every 3 steps by a `CheckpointManager` (SAVE_WITH=checkpoint:
`checkpoint.save(prefix)`; SAVE_WITH=shared: every worker's manager on
CKPT_DIR, restored by `manager.latest_checkpoint`, for the memory tier,
which keeps a worker's saves in memory; else the chief into
CKPT_DIR, a worker into `CKPT_DIR/workertemp_<i>`, removed after: the
tutorial's), `tf.train.latest_checkpoint(CKPT_DIR)` restored at the start.
Each worker appends `{"step": S, "ids": [...]}` per step to
IDS_DIR/g<generation>-w<index>.jsonl. KILL_AT_STEP=S: in the first
generation, worker 1 kills itself (SIGKILL) right after step S.
"""

import json
import os
import signal
import sys

import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
index = tf_config.get("task", {}).get("index", 0)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
GLOBAL_BATCH, STEPS, EPOCHS = 8, 8, 3


def sample(i):
    return tf.stack([tf.cast(i, tf.float32), tf.sin(tf.cast(i, tf.float32))])


def stream():
    return tf.data.Dataset.range(64).shuffle(64, seed=7, reshuffle_each_iteration=True).repeat()


def pipeline(context):
    ids = stream().shard(context.num_input_pipelines, context.input_pipeline_id)
    return ids.map(sample).batch(context.get_per_replica_batch_size(GLOBAL_BATCH))


num_workers = len(tf_config.get("cluster", {}).get("worker", [])) or 1
shard = os.environ.get("SHARD", "worker")
if shard == "pipeline":
    dataset = strategy.distribute_datasets_from_function(pipeline)
elif shard == "data":
    dataset = strategy.experimental_distribute_dataset(stream().map(sample).batch(GLOBAL_BATCH))
else:  # a plain tf.data iterator per worker, its own shard, one replica a worker
    dataset = stream().shard(num_workers, index).map(sample).batch(GLOBAL_BATCH // num_workers)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(4, "relu"),
                                 tf.keras.layers.Dense(1)])
    optimizer = tf.keras.optimizers.SGD(0.05)
    epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False)


@tf.function
def train_step(batch):
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x[:, 1:]) - 1.0))  # not the id
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    strategy.run(step, args=(batch,))


iterator = iter(dataset)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, iterator=iterator,
                                 epoch=epoch, step_in_epoch=step_in_epoch)
chief = index == 0
shared = os.environ.get("SAVE_WITH") == "shared"  # every worker's manager on the directory
directory = sys.argv[1] if chief or shared else os.path.join(sys.argv[1], f"workertemp_{index}")
manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)
latest = manager.latest_checkpoint if shared else tf.train.latest_checkpoint(sys.argv[1])
if latest:
    checkpoint.restore(latest)
ids_path = os.path.join(sys.argv[2], f"g{os.environ.get('MGPU_GENERATION', '0')}-w{index}.jsonl")
kill_at = int(os.environ.get("KILL_AT_STEP") or 0)
while epoch.numpy() < EPOCHS:
    while step_in_epoch.numpy() < STEPS:
        batch = next(iterator)
        train_step(batch)
        step_in_epoch.assign_add(1)
        step = int(optimizer.iterations.numpy())
        ids = [int(i) for x in strategy.experimental_local_results(batch) for i in x[:, 0]] \
            if shard != "worker" else [int(i) for i in batch[:, 0]]
        with open(ids_path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"step": step, "ids": ids}) + "\n")
        if step % 3 == 0:
            if os.environ.get("SAVE_WITH") == "checkpoint":
                checkpoint.save(os.path.join(directory, "ckpt"))
            else:
                manager.save()
            if not chief and not shared:
                tf.io.gfile.rmtree(directory)
        if step == kill_at and index == 1 and os.environ.get("MGPU_GENERATION") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
    epoch.assign_add(1)
    step_in_epoch.assign(0)
print("STEPS_DONE", int(optimizer.iterations.numpy()), flush=True)
