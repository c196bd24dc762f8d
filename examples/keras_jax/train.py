"""Keras 3 on JAX across processes: scikit-learn's digits (no download), on CPU.

Runs as is on one machine (`python train.py`) and on many under mgpu-launch,
with `strategy: keras_distribution` and `keras: jax` in the cluster file
(see examples/keras_jax/cluster.yaml), or simulated:

    mgpu-launch --local 2 examples/keras_jax/train.py --epochs 6

(`--local` plans TensorFlow's TF_CONFIG; `runtime.distribution()` takes the
processes from it.) Each process trains on its share of the examples; the
gradients are averaged over all of them by JAX, so every process ends with the
same weights, which the last line shows as a checksum.
"""

import argparse
import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is imported

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

from launcher import runtime  # noqa: E402


def load_data(seed: int = 0):
    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]  # 8x8x1 in [0, 1]
    labels = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    return (images[:split], labels[:split]), (images[split:], labels[split:])


def whole_batches(batch: int, *arrays):
    """Drop the last partial batch: every process runs the same steps, same shapes."""
    usable = len(arrays[0]) // batch * batch
    return tuple(a[:usable] for a in arrays)


def build_model():
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
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-per-process", type=int, default=32)
    args = parser.parse_args()

    # The same initial weights in every process (keras.distribution.initialize()
    # would agree on a seed too; Keras imports TensorFlow to seed it either way).
    keras.utils.set_random_seed(0)
    runtime.distribution(auto_shard_dataset=False)  # we shard the arrays ourselves
    (x_train, y_train), (x_test, y_test) = load_data()
    # This process's share; the batches of all processes make the global batch.
    x_train, y_train = whole_batches(args.batch_per_process,
                                     *runtime.shard_arrays(x_train, y_train))
    x_test, y_test = whole_batches(args.batch_per_process, *runtime.shard_arrays(x_test, y_test))
    model = build_model()
    model.fit(x_train, y_train, batch_size=args.batch_per_process, epochs=args.epochs,
              callbacks=runtime.callbacks(), verbose=2)
    # Metrics are averaged over every process's share (a collective: all call it).
    _, accuracy = model.evaluate(x_test, y_test, batch_size=args.batch_per_process, verbose=0)
    # The weights are replicated in every process: each can read them.
    checksum = sum(float(np.sum(np.asarray(w, dtype="float64"))) for w in model.get_weights())
    print(f"test accuracy: {accuracy:.3f} (process {runtime.process_id()}, "
          f"num_processes {runtime.num_processes()})")
    print(f"WEIGHTS_CHECKSUM {checksum:.6f}")


if __name__ == "__main__":
    main()
