"""A plain TF1 training loop as old scripts wrote it (nothing of mgpu-launch).

    tf1_plain_loop.py CKPT_DIR STEPS [nostep]

Graph mode, `tf.compat.v1.Session.run(train_op)` with no MonitoredSession, the
global step from `get_or_create_global_step()`, a `Saver` of its own saving
every 10 global steps as `model.ckpt-N` and restoring the latest with
`Saver.restore`. With `nostep`: no global step in the graph, its steps counted
in Python and saved as `model.ckpt` (no `-N`). A short pause after each step.
Prints `TRAINED N` (its step) at the end.
"""

import os
import sys
import time

import tensorflow as tf

directory, steps, nostep = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["nostep"]
tf.compat.v1.disable_eager_execution()
global_step = None if nostep else tf.compat.v1.train.get_or_create_global_step()
weight = tf.compat.v1.get_variable("weight", (4, 1))
x = tf.random.normal((16, 4))
loss = tf.reduce_mean(tf.square(tf.matmul(x, weight) - tf.reduce_sum(x, 1, keepdims=True)))
train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, global_step)
saver = tf.compat.v1.train.Saver()
prefix = os.path.join(directory, "model.ckpt")
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    latest = tf.train.latest_checkpoint(directory)
    if latest:
        saver.restore(sess, latest)
    step = 0 if nostep else sess.run(global_step)
    while step < steps:
        sess.run(train_op)
        step = step + 1 if nostep else sess.run(global_step)
        if step % 10 == 0:
            saver.save(sess, prefix, global_step=global_step)
        time.sleep(0.02)
print(f"TRAINED {step}", flush=True)
