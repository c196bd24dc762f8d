"""Each generation restores a real TensorFlow checkpoint, trains one more step,
saves it with tf.train.CheckpointManager, then crashes (exit 1): progress every
time, so every restart is free, up to restart.max_total_restarts. It reports
nothing to the launcher: the checkpoint's state alone must show the progress."""

import os

import tensorflow as tf

step = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(step=step)
manager = tf.train.CheckpointManager(checkpoint, os.environ["MGPU_CHECKPOINT_DIR"],
                                     max_to_keep=2)
checkpoint.restore(manager.latest_checkpoint)
step.assign_add(1)
manager.save()
print(f"generation {os.environ['MGPU_GENERATION']}: saved step {int(step)}", flush=True)
os._exit(1)
