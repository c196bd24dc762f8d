"""The shape of TensorFlow's "Parameter server training" tutorial, Keras
`Model.fit` part; knows nothing of mgpu-launch.

`ParameterServerStrategy` from `TF_CONFIG`, a `DatasetCreator`, a small model
compiled in the strategy's scope, and `fit` with the tutorial's callbacks:
`ModelCheckpoint` and `BackupAndRestore` in a working directory (argv[1]).
Run by the chief only; the workers and ps serve. tf.keras is tf_keras (Keras
3's `fit` does not support ParameterServerStrategy). `--epochs`, `--steps`
(per epoch), `--step-s` (a sleep per epoch's end, to stretch the run).
"""

import argparse
import os
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("working_dir")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--epoch-s", type=float, default=0.0)
args = parser.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver)


def dataset_fn(input_context):
    global_batch_size = 64
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    x = tf.random.uniform((10, 10))
    y = tf.random.uniform((10,))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size).prefetch(2)


dc = tf.keras.utils.experimental.DatasetCreator(dataset_fn)

with strategy.scope():
    model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
    model.compile(tf.keras.optimizers.SGD(), loss="mse", steps_per_execution=5)


class Pace(tf.keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        time.sleep(args.epoch_s)


callbacks = [
    tf.keras.callbacks.ModelCheckpoint(filepath=os.path.join(args.working_dir, "ckpt")),
    tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(args.working_dir, "backup")),
    Pace(),
]
model.fit(dc, epochs=args.epochs, steps_per_epoch=args.steps, callbacks=callbacks)
print("FIT_DONE", flush=True)
