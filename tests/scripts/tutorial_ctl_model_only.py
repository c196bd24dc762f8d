"""TF's "Custom training loop with MultiWorkerMirroredStrategy" tutorial, as
written: its checkpoint holds the model, the epoch and the step in the epoch,
but not the optimizer; non-chief workers save into a temporary directory and
remove it after each save; a restart restores `latest_checkpoint` of the
chief's directory (its first argument). Small data made here. One change: the
loss print is skipped for an epoch with no step (below). With `list` as third
argument a non-chief worker looks at what it saved before removing it, as a
script that lists or copies its files would (`SCRATCH` line). Knows nothing of
mgpu-launch."""

import json
import os
import sys

import numpy as np
import tensorflow as tf

checkpoint_dir = sys.argv[1]
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
look = sys.argv[3:4] == ["list"]
tf_config = json.loads(os.environ["TF_CONFIG"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = 16 * num_workers
steps_per_epoch = 20

rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int64")


def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


multi_worker_dataset = strategy.distribute_datasets_from_function(dataset_fn)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input(shape=(8,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(features, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, logits),
                                              global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


def _is_chief(task_type, task_id):
    return task_type == "chief" or (task_type == "worker" and task_id == 0)


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = os.path.join(dirpath, "workertemp_" + str(task_id))
        tf.io.gfile.makedirs(dirpath)
    return os.path.join(dirpath, base)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64),
                            name="step_in_epoch")
task_type, task_id = tf_config["task"]["type"], tf_config["task"]["index"]
checkpoint = tf.train.Checkpoint(model=model, epoch=epoch, step_in_epoch=step_in_epoch)
write_checkpoint_dir = write_filepath(os.path.join(checkpoint_dir, "ckpt"), task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                max_to_keep=1)
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir + "/ckpt")
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)

while epoch.numpy() < epochs:
    iterator = iter(multi_worker_dataset)
    total_loss, num_batches = 0.0, 0
    while step_in_epoch.numpy() < steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)
    # The tutorial divides by num_batches, 0 after a restore of its epoch-end save
    # (saved before step_in_epoch is reset): ZeroDivisionError on every restart.
    if num_batches:
        print(f"Epoch: {epoch.numpy()}, train_loss: {total_loss / num_batches:f}.", flush=True)
    checkpoint_manager.save()
    if not _is_chief(task_type, task_id):
        if look:
            latest = tf.train.latest_checkpoint(write_checkpoint_dir)
            print(f"SCRATCH {sorted(tf.io.gfile.listdir(write_checkpoint_dir))} "
                  f"LATEST {latest and os.path.basename(latest)}", flush=True)
        tf.io.gfile.rmtree(write_checkpoint_dir)
    epoch.assign_add(1)
    step_in_epoch.assign(0)
