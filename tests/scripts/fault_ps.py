"""A tiny ParameterServerStrategy job: the chief (coordinator) schedules steps on the workers.

    fault_ps.py [--steps 40] [--step-s 0.1]

Worker and ps tasks run `launcher.runtime.server` (the launcher starts them);
only the chief runs this. Each step is a closure scheduled on a worker that
updates a variable on the ps; the chief checkpoints every 5 steps in
MGPU_CHECKPOINT_DIR, resumes from it, reports progress, and prints
`RESUME gen=G step=S` and `DONE step=S`.
"""

import argparse
import os
import time

import tensorflow as tf

from launcher import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--step-s", type=float, default=0.1)
args = parser.parse_args()

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
strategy = tf.distribute.ParameterServerStrategy(resolver)
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    weight = tf.Variable(0.0)
    done = tf.Variable(0, dtype=tf.int64)
checkpoint = tf.train.Checkpoint(weight=weight, done=done)
manager = tf.train.CheckpointManager(checkpoint, runtime.checkpoint_dir(), max_to_keep=1)
manager.restore_or_initialize()
start = int(done.numpy())
print(f"RESUME gen={os.environ.get('MGPU_GENERATION', '0')} step={start}", flush=True)


@tf.function
def train_step():
    x = tf.random.normal((64, 64))
    weight.assign_add(tf.reduce_mean(tf.matmul(x, x)) * 0.0 + 1.0)
    return weight.read_value()


for step in range(start + 1, args.steps + 1):
    coordinator.schedule(train_step)
    coordinator.join()  # this step's closure ran (rescheduled if its worker died)
    done.assign(step)
    if step % 5 == 0:
        manager.save()
    runtime.report_progress(step)
    time.sleep(args.step_s)
print(f"DONE step={int(done.numpy())}", flush=True)
