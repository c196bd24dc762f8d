"""worker0 sets up MultiWorkerMirroredStrategy; worker1 never gets there: it
waits for data that never comes. The launcher must name worker1 when
restart.start_timeout_s runs out, with the frame it is stuck in."""

import os
import threading

index = int(os.environ["MGPU_TASK_INDEX"])


def wait_for_data():
    threading.Event().wait()


if index == 1:
    print("loading the data set", flush=True)
    wait_for_data()

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("never printed: worker1 never joins", flush=True)
