"""What the NaN sentinel (launcher/runtime/sentinel.py) costs a training process.

Two figures, each in a fresh process per Keras (tf_keras, Keras 3 on TensorFlow):

- the step: a small dense model's `fit` on CPU (the tests' tutorial shape,
  batch 64), epochs alternating with and without the sentinel's callback;
  the median step time of each and their difference;
- the save check: `all_finite` over a model's trainable weights (what the
  bootstrap reads before it reports a save), for that small model and for a
  ~100 MB one (two 3,536 x 3,536 dense layers: 25 M float32 weights), beside
  the time of a `tf.train.Checkpoint.write` of the same model to a temporary
  directory (the save it guards).

    python bench/sentinel_cost.py [--epochs 6] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

ROUND = r"""
import json, os, statistics, sys, tempfile, time
os.environ["TF_USE_LEGACY_KERAS"] = sys.argv[1]
epochs, repeat = int(sys.argv[2]), int(sys.argv[3])
import numpy as np
import tensorflow as tf
from launcher.runtime import sentinel

keras = tf.keras
x = np.random.default_rng(0).normal(size=(64 * 200, 32)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.layers.Input(shape=(32,)),
                          keras.layers.Dense(128, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.001), loss="mse")


class Times(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(time.perf_counter())

    def on_epoch_begin(self, epoch, logs=None):
        self.ends = [time.perf_counter()]


watch = sentinel._loss_callback(keras.callbacks)
steps = {True: [], False: []}
model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # traced, warm
for epoch in range(2 * epochs):
    on = epoch % 2 == 0
    times = Times()
    model.fit(x, y, batch_size=64, epochs=1, verbose=0,
              callbacks=[watch(), times] if on else [times])
    steps[on] += [b - a for a, b in zip(times.ends, times.ends[1:])]


def timed(fn):
    took = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        took.append(time.perf_counter() - began)
    return statistics.median(took)


big = keras.Sequential([keras.layers.Input(shape=(3536,)), keras.layers.Dense(3536),
                        keras.layers.Dense(3536)])
mb = sum(int(np.prod(w.shape)) for w in big.trainable_weights) * 4 / 1e6
folder = tempfile.mkdtemp()
checkpoint = tf.train.Checkpoint(model=big)
print(json.dumps({
    "keras": "tf_keras" if sys.argv[1] == "1" else "keras3",
    "step_on_ms": statistics.median(steps[True]) * 1e3,
    "step_off_ms": statistics.median(steps[False]) * 1e3,
    "check_small_ms": timed(lambda: sentinel.all_finite(model.trainable_weights)) * 1e3,
    "big_mb": mb,
    "check_big_ms": timed(lambda: sentinel.all_finite(big.trainable_weights)) * 1e3,
    "write_big_ms": timed(lambda: checkpoint.write(os.path.join(folder, "c"))) * 1e3,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print("| Keras | step, sentinel off | on | difference | check, small model | "
          "check, ~100 MB | Checkpoint.write, ~100 MB |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for legacy in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", ROUND, legacy, str(args.epochs),
                              str(args.repeat)], cwd=REPO, capture_output=True, text=True,
                             env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
                                  "PATH": "/usr/bin:/bin"}, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {r['keras']} | {r['step_off_ms']:.3f} ms | {r['step_on_ms']:.3f} ms | "
              f"{r['step_on_ms'] - r['step_off_ms']:+.3f} ms | {r['check_small_ms']:.3f} ms | "
              f"{r['check_big_ms']:.1f} ms ({r['big_mb']:.0f} MB) | "
              f"{r['write_big_ms']:.0f} ms |")


if __name__ == "__main__":
    main()
