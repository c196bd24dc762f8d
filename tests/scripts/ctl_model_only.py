"""TF's custom-loop tutorial shape in one process: its own CheckpointManager
over a checkpoint that holds the model but not the optimizer, restored from
`latest_checkpoint`, then two steps and a save. Knows nothing of mgpu-launch."""

import sys

import tensorflow as tf

directory = sys.argv[1]
model = tf.keras.Sequential([tf.keras.layers.Input(shape=(2,)), tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.SGD(0.1)
checkpoint = tf.train.Checkpoint(model=model)  # the tutorial's: no optimizer
manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3)
checkpoint.restore(manager.latest_checkpoint)
for _ in range(2):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(tf.ones((4, 2))) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables, strict=True))
manager.save()
print("SAVED", flush=True)
