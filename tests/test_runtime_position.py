"""runtime/position.py with a real Keras 3 `fit`, `evaluate` and `save` in a
task-like process: the phase, the epoch, its length and the steps each epoch
had reach the progress channel; a dataset of unknown length without
steps_per_epoch is warned of in a multi-worker job; a custom loop's
distributed calls are counted (runtime/calls.py). (tf_keras under
MultiWorkerMirroredStrategy: tests/test_stuck_e2e.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, os
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": ["a:1", "b:2"]},
                                      "task": {"type": "worker", "index": 0}})
import keras, numpy as np, tensorflow as tf
from launcher.runtime import position, steps
steps.on_keras(keras); position.on_keras(keras); position.on_tensorflow(tf)
model = keras.Sequential([keras.layers.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
x, y = np.zeros((32, 4), "float32"), np.zeros((32, 1), "float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
model.fit(data, epochs=2, verbose=0)
model.evaluate(data, verbose=0)
tf.train.Checkpoint(model=model).write(os.path.join(os.environ["OUT"], "ckpt"))
model.fit(data.filter(lambda a, b: True), epochs=1, verbose=0)
# A custom loop's distributed calls (runtime/calls.py), counted from here.
from launcher import runtime
from launcher.runtime import calls
calls.on_tensorflow(tf)
before = calls._count
strategy = tf.distribute.MirroredStrategy(["/cpu:0"])

@tf.function
def train_step():
    return strategy.run(lambda: tf.constant(1.0))

for _ in range(3):
    value = train_step()
strategy.reduce("SUM", value, axis=None)  # eager: the chief's metric, say
runtime.write_progress({"calls_before": before})
"""


def test_a_real_fit_reports_its_position(tmp_path: Path):
    progress = tmp_path / "progress.jsonl"
    fd = os.open(progress, os.O_WRONLY | os.O_CREAT, 0o600)
    env = {**os.environ, "PYTHONPATH": str(REPO), "MGPU_PROGRESS_FD": str(fd),
           "OUT": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, pass_fds=(fd,),
                            capture_output=True, text=True, timeout=180)
    os.close(fd)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in progress.read_text().splitlines()]
    said = [(r.get("at"), r.get("at_epoch"), r.get("at_ended")) for r in records]
    first = records[0]
    assert (first["at"], first["at_len"], first["at_len_by"], first["at_epochs"]) == \
        ("train", 4, "input", 2), first
    # Each epoch's start and end, with the steps it had (the optimizer's counter).
    assert ("train", 1, [0, 4]) in said and ("train", 1, [1, 4]) in said, said
    assert any(r["at"] == "train" and r.get("at_epoch") == 1 and r["at_from"] == 4
               for r in records), records
    evaluating = [r for r in records if r["at"] == "evaluate"]
    assert evaluating and evaluating[0]["at_step"] == 8, records
    assert any(r["at"] == "save" for r in records), said  # a custom loop's checkpoint
    assert records[-2]["at"] == "outside", said
    # The second fit: unknown length, no steps_per_epoch, two workers.
    assert records[-2]["at_len"] == 0
    # Three calls of a distributed tf.function (its first traced it), one eager reduce.
    last = records[-1]
    assert last["at_calls"] - last["calls_before"] == 4, last
    assert (last["at_call"], last["at_call_n"]) == ("strategy.reduce()", 1), last
    assert "fit() got a dataset of unknown length and no steps_per_epoch" in result.stderr
