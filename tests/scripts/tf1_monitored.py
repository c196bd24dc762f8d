"""TF1 between-graph replication as the old tutorials wrote it (nothing of mgpu-launch).

    tf1_monitored.py --dir CKPT_DIR [--last-step 300] [--save-steps 25] [--step-s 0.01]
                     [--after-chief FILE]

`tf.compat.v1.train.Server` from TF_CONFIG (a ps joins for ever), variables on
the ps through `replica_device_setter`, `MonitoredTrainingSession` with its own
checkpoint directory (the chief, worker 0, saves every `--save-steps` global
steps and restores from there) and `StopAtStepHook(last_step)`. Each worker
prints `DONE step=S` when its session ends. With `--after-chief`, worker 1
creates its session only once worker 0's process is gone (its pid in FILE):
the session it waits for can never form.
"""

import argparse
import json
import os
import time

import tensorflow as tf

parser = argparse.ArgumentParser()
parser.add_argument("--dir", required=True)
parser.add_argument("--last-step", type=int, default=300)
parser.add_argument("--save-steps", type=int, default=25)
parser.add_argument("--step-s", type=float, default=0.01)
parser.add_argument("--after-chief", default="")  # worker 1 starts once worker 0 is gone
args = parser.parse_args()

tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
cluster = tf.train.ClusterSpec(config["cluster"])
job, index = config["task"]["type"], config["task"]["index"]
server = tf.compat.v1.train.Server(cluster, job_name=job, task_index=index)
if job == "ps":
    server.join()

with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{index}", cluster=cluster)):
    global_step = tf.compat.v1.train.get_or_create_global_step()
    x = tf.random.normal((32, 4))
    weight = tf.compat.v1.get_variable("weight", (4, 1))
    loss = tf.reduce_mean(tf.square(tf.matmul(x, weight) - tf.reduce_sum(x, 1, keepdims=True)))
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(
        loss, global_step=global_step)

if args.after_chief and index == 0:
    with open(args.after_chief + ".tmp", "w") as handle:
        handle.write(str(os.getpid()))
    os.rename(args.after_chief + ".tmp", args.after_chief)
elif args.after_chief:  # a finished job launched again: its chief exits at once
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with open(args.after_chief) as handle:
                os.kill(int(handle.read()), 0)
        except (FileNotFoundError, ProcessLookupError):
            if os.path.exists(args.after_chief):
                break
        time.sleep(0.1)
hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.last_step)]
with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=index == 0, checkpoint_dir=args.dir,
        save_checkpoint_steps=args.save_steps, save_summaries_steps=None,
        save_summaries_secs=None, log_step_count_steps=None, hooks=hooks) as session:
    step = 0
    while not session.should_stop():
        _, step = session.run([train_op, global_step])
        time.sleep(args.step_s)
print(f"DONE step={step}", flush=True)
