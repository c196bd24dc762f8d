"""Writes into the checkpoint directory (as a TensorBoard callback would), then
crashes the same way every time, without a Python exception (exit 3). No TensorFlow.
A changed file is not progress: the launcher must stop after max_restarts."""

import os
import pathlib
import sys
import time

logs = pathlib.Path(os.environ["MGPU_CHECKPOINT_DIR"], "tensorboard")
logs.mkdir(parents=True, exist_ok=True)
(logs / f"events.out.tfevents.{time.time():.6f}").write_text("summary")
print(f"generation {os.environ['MGPU_GENERATION']}: wrote a TensorBoard file", flush=True)
sys.exit(3)
