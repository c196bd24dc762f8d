"""TF's "Custom training loop with Keras and MultiWorkerMirroredStrategy"
tutorial, written for tf.keras = Keras 2 (tf_keras), cut down to synthetic data.

Knows nothing of mgpu-launch. Under Keras 3 it fails at the end of the first
epoch: Keras 3 metrics have `reset_state()`, not the tutorial's `reset_states()`.
Under `TF_USE_LEGACY_KERAS=1` it trains and prints TRAINED.
"""

import json
import os

import numpy as np
import tensorflow as tf

tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
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
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


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
        train_accuracy.update_state(y, predictions)
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


iterator = iter(dist_dataset)
for epoch in range(2):
    total_loss = 0.0
    for _ in range(4):
        total_loss += train_step(iterator)
    print(f"Epoch {epoch}, loss {float(total_loss) / 4:.3f}, "
          f"accuracy {float(train_accuracy.result()):.3f}", flush=True)
    train_accuracy.reset_states()
print("TRAINED", flush=True)
