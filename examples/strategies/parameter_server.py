"""ParameterServerStrategy with Keras `Model.fit`, the TensorFlow tutorial's way.

Under mgpu-launch with `strategy: parameter_server`, this script runs on the
chief (the coordinator) only; the workers and ps run TensorFlow servers that
the launcher starts and stops (`python -m launcher.runtime.server`):

    mgpu-launch examples/strategies/parameter_server.yaml \\
        examples/strategies/parameter_server.py --epochs 2

Uses `tf.keras` (tf_keras): Keras 3's `Model.fit` does not support
ParameterServerStrategy. Keras' TensorBoard callback writes to
`<checkpoint dir>/tensorboard` (needs the `tensorboard` package).
"""

import argparse
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras -> tf_keras

import tensorflow as tf  # noqa: E402

from launcher import runtime  # noqa: E402


def dataset_fn(input_context):
    """Runs on each worker: its own shard of a synthetic regression problem."""
    global_batch = 64
    batch = input_context.get_per_replica_batch_size(global_batch)
    x = tf.random.stateless_normal((1024, 8), seed=(1, 2))
    y = tf.reduce_sum(x * tf.range(1.0, 9.0), axis=1, keepdims=True)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shard(
        input_context.num_input_pipelines, input_context.input_pipeline_id)
    return data.shuffle(1024).repeat().batch(batch).prefetch(2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch")
    parser.add_argument("--save", default="", help="where the chief saves the model")
    args = parser.parse_args()

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    num_ps = len(resolver.cluster_spec().as_dict().get("ps", []))
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=max(1, num_ps))
    strategy = tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((8,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(1),
        ])
        model.compile(tf.keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=5)

    logs = os.path.join(runtime.checkpoint_dir(), "tensorboard")
    history = model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=args.epochs,
        steps_per_epoch=args.steps,
        callbacks=[tf.keras.callbacks.TensorBoard(log_dir=logs),
                   *runtime.callbacks(model=model)],
        verbose=2,
    )
    print(f"final loss {history.history['loss'][-1]:.4f}; TensorBoard logs in {logs}",
          flush=True)
    if args.save:
        runtime.save_model(model, args.save)


if __name__ == "__main__":
    main()
