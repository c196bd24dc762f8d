"""TF's "Custom training loop with Keras and MultiWorkerMirroredStrategy"
tutorial (tf_keras), cut down to synthetic data, with one bug: after each
epoch the chief alone evaluates (a distributed eval_step and the metric's
result). Knows nothing of mgpu-launch.
"""

import json
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

task = json.loads(os.environ["TF_CONFIG"])["task"]
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = 16 * strategy.num_replicas_in_sync

x = np.random.default_rng(0).random((64, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int64")
dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size)
dist_dataset = strategy.experimental_distribute_dataset(dataset)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((8,)),
                                 tf.keras.layers.Dense(16, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=tf.keras.losses.Reduction.NONE)(y, predictions)
            loss = tf.nn.compute_average_loss(per_example_loss,
                                              global_batch_size=global_batch_size)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


@tf.function
def eval_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        eval_accuracy.update_state(y, model(x, training=False))

    strategy.run(step_fn, args=(next(iterator),))


iterator = iter(dist_dataset)
for epoch in range(3):
    total_loss = 0.0
    for _ in range(10):
        total_loss += train_step(iterator)
    print(f"Epoch {epoch}, loss {float(total_loss) / 10:.3f}", flush=True)
    if task["index"] == 0:  # the bug: evaluation on the chief only
        for _ in range(2):
            eval_step(iterator)
        print(f"eval accuracy {float(eval_accuracy.result()):.3f}", flush=True)
        eval_accuracy.reset_states()
print("TRAINED", flush=True)
