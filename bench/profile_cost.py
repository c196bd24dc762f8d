"""What one trace of `mgpu-launch profile` costs a training job, in seconds.

One process trains a tf_keras `fit` (a small dense model on CPU, as the
tests' tutorial) and records the end time of every step. In the middle of
the run a thread traces the process exactly as a task does on request
(`launcher.runtime.trace.trace`: `tf.profiler.experimental.start`, S seconds,
`stop`, the xplane.pb summarised). The cost is the time the steps around the
trace took beyond their pace before it:

    slowdown = (time of the steps from the trace's start until the pace is back)
               - (those steps x the median step time before the trace)

Printed per round with the trace's own figures (stop and summary time),
then the median. Each round is a fresh process (the profiler's first start in
a process costs more: that is what a job pays on its first `profile`).

    python bench/profile_cost.py [--rounds 3] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROUND = r"""
import json, os, statistics, sys, threading, time
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import numpy as np
import tensorflow as tf
from launcher.runtime import trace

seconds, logdir = float(sys.argv[1]), sys.argv[2]
x = np.random.default_rng(0).normal(size=(4096, 32)).astype("float32")
y = (x.sum(axis=1, keepdims=True) > 0).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(64)
model = tf.keras.Sequential([tf.keras.layers.Input(shape=(32,)),
                             tf.keras.layers.Dense(128, activation="relu"),
                             tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
ends = []
marks = {}

class Clock(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        ends.append(time.perf_counter())
        if len(ends) == 300:
            threading.Thread(target=tracer, daemon=True).start()
        if "done" in marks and len(ends) > marks["done_step"] + 300:
            self.model.stop_training = True

def tracer():
    marks["start"] = time.perf_counter()
    marks["record"] = trace.trace(logdir, seconds)
    marks["done"] = time.perf_counter()
    marks["done_step"] = len(ends)

model.fit(data, epochs=1, steps_per_epoch=10**7, callbacks=[Clock()], verbose=0)
steps = [b - a for a, b in zip(ends, ends[1:])]
pace = statistics.median(steps[50:299])
first = next(i for i, t in enumerate(ends) if t >= marks["start"])
# until the pace is back: the first 50 steps after the trace within 1.5x pace
after = [i for i in range(marks["done_step"], len(ends) - 50)
         if statistics.median(steps[i:i + 50]) <= pace * 1.5]
back = after[0] if after else len(ends) - 1
span = ends[back] - ends[first - 1]
print(json.dumps({"pace_ms": pace * 1000, "steps": back - first + 1,
                  "slowdown_s": span - (back - first + 1) * pace,
                  "trace_wall_s": marks["done"] - marks["start"],
                  "stop_s": marks["record"].get("stop_s"),
                  "summary": marks["record"].get("summary")}))
"""


def one_round(seconds: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="mgpu-profile-bench-") as logdir:
        done = subprocess.run([sys.executable, "-c", ROUND, str(seconds), logdir],
                              cwd=REPO, capture_output=True, text=True, timeout=600,
                              env={**__import__("os").environ, "PYTHONPATH": str(REPO),
                                   "TF_CPP_MIN_LOG_LEVEL": "2"})
    if done.returncode != 0:
        raise SystemExit(f"a round failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    results = []
    for number in range(1, args.rounds + 1):
        result = one_round(args.seconds)
        results.append(result)
        print(f"round {number}: step {result['pace_ms']:.2f} ms, a {args.seconds:g} s trace "
              f"took {result['trace_wall_s']:.2f} s (stop and write {result['stop_s']} s), "
              f"slowdown {result['slowdown_s']:.2f} s over {result['steps']} steps", flush=True)
    slowdowns = [r["slowdown_s"] for r in results]
    print(f"median slowdown of one {args.seconds:g} s trace: {statistics.median(slowdowns):.2f} s "
          f"(min {min(slowdowns):.2f}, max {max(slowdowns):.2f}; {args.rounds} rounds)")


if __name__ == "__main__":
    main()
