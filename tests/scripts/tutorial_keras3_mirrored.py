"""TensorFlow's distributed Keras tutorial (tutorials/distribute/keras), condensed.

Written for Keras 3 through `tf.keras`, as the tutorial is today, and knows
nothing of mgpu-launch: `tf.distribute.MirroredStrategy` on one host,
`ModelCheckpoint` saving `.weights.h5` files, then `load_weights` of the last
one and `evaluate`. Under tf_keras (`TF_USE_LEGACY_KERAS=1`) it fails in
`load_weights`. Prints `EVAL {"loss": ..., "accuracy": ..., "keras": ...}`.

    tutorial_keras3_mirrored.py CHECKPOINT_DIR [--epochs 3]
"""

import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("checkpoint_dir")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)

rng = np.random.default_rng(0)
images = rng.uniform(size=(512, 8, 8, 1)).astype("float32")
labels = (images.reshape(512, -1).mean(axis=1) > 0.5).astype("int64")
batch = 32 * strategy.num_replicas_in_sync
train_dataset = tf.data.Dataset.from_tensor_slices((images[:384], labels[:384])).batch(batch)
eval_dataset = tf.data.Dataset.from_tensor_slices((images[384:], labels[384:])).batch(batch)

with strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(2),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
                  metrics=["accuracy"])

checkpoint_prefix = os.path.join(args.checkpoint_dir, "ckpt_{epoch}.weights.h5")


def decay(epoch):
    return 1e-3 if epoch < 2 else 1e-4


callbacks = [
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
]
model.fit(train_dataset, epochs=args.epochs, callbacks=callbacks, verbose=2)

model.load_weights(checkpoint_prefix.format(epoch=args.epochs))
eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
print("EVAL " + json.dumps({"loss": float(eval_loss), "accuracy": float(eval_acc),
                            "keras": tf.keras.__name__}), flush=True)
