"""A custom loop's checkpoints, saved and restored as the script asks (argv):

- `save DIR N [nan]`: N saves of a `tf.train.CheckpointManager(max_to_keep=3)`,
  the optimizer's step 10, 20, ... in each (`nan`: the last save's first kernel
  holds a NaN, as a save made after the loss went bad does);
- `manager DIR [save]`: `checkpoint.restore(manager.latest_checkpoint)`, then
  (with `save`) one more save;
- `latest DIR`: `checkpoint.restore(tf.train.latest_checkpoint(DIR))`.

Prints `RESTORED {"step": ..., "latest": ...}` after a restore. Knows nothing
of mgpu-launch.
"""

import json
import sys

import tensorflow as tf

mode, directory = sys.argv[1], sys.argv[2]
model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(16),
                             tf.keras.layers.Dense(2)])
optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
optimizer.build(model.trainable_variables)
checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=3) \
    if mode != "latest" else None  # `latest`: no manager read the directory first
if mode == "save":
    for i in range(int(sys.argv[3])):
        optimizer.iterations.assign(10 * (i + 1))
        if sys.argv[4:] == ["nan"] and i == int(sys.argv[3]) - 1:
            kernel = model.layers[0].kernel
            kernel.assign(tf.tensor_scatter_nd_update(kernel, [[0, 0]], [float("nan")]))
        manager.save()
    sys.exit(0)
if mode == "manager":
    checkpoint.restore(manager.latest_checkpoint)
else:
    checkpoint.restore(tf.train.latest_checkpoint(directory))
print("RESTORED " + json.dumps({"step": int(optimizer.iterations.numpy()),
                                "latest": manager and manager.latest_checkpoint}), flush=True)
if sys.argv[3:] == ["save"]:
    manager.save()
