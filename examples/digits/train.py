"""Classify scikit-learn's handwritten digits (shipped with the package, no download).

Runs as is on one machine (`python train.py`) and on many under mgpu-launch:

    mgpu-launch --local 2 examples/digits/train.py --epochs 8

What makes it multi-worker is the runtime: its strategy, its callbacks (resume
from the shared checkpoint directory after a restart) and a chief-only save.
"""

import argparse
import os

# tf.keras -> tf_keras (docs/strategies-and-keras.md)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from launcher import runtime  # noqa: E402


def load_data(seed: int = 0):
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]  # 8x8x1 in [0, 1]
    labels = digits.target.astype("int64")
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def build_model():
    keras = tf.keras
    model = keras.Sequential([
        keras.layers.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-per-replica", type=int, default=32)
    parser.add_argument("--save", default="", help="where the chief saves the trained model")
    args = parser.parse_args()

    tf.keras.utils.set_random_seed(0)  # same initial weights on every worker
    strategy = runtime.strategy()
    global_batch = args.batch_per_replica * strategy.num_replicas_in_sync
    (x_train, y_train), (x_test, y_test) = load_data()
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(2048, seed=0)
    train = train.repeat().batch(global_batch)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = train.with_options(options)
    steps_per_epoch = len(x_train) // global_batch

    with strategy.scope():
        model = build_model()
    model.fit(train, epochs=args.epochs, steps_per_epoch=steps_per_epoch,
              callbacks=runtime.callbacks(), verbose=2)
    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"test accuracy: {accuracy:.3f} (worker {runtime.task_index()} of "
          f"{runtime.num_workers()}, {strategy.num_replicas_in_sync} replicas in sync)")
    if args.save:
        runtime.save_model(model, args.save)


if __name__ == "__main__":
    main()
