"""The keras-io multi-GPU guide's pattern once switched to MWMS: one strategy at
the top, another one per run_training() call. The second must be refused with
the fix, before any collective runs."""

import tensorflow as tf

from launcher import runtime

strategy = runtime.strategy()
assert runtime.strategy() is strategy  # the runtime makes one and reuses it


def run_training():
    again = tf.distribute.MultiWorkerMirroredStrategy()
    print("never printed: created twice", again, flush=True)


run_training()
