"""A cheap job without TensorFlow for the launcher's own fault paths.

    fault_steps.py [--steps 30] [--step-s 0.1] [--fault silent|exit42]
                   [--fault-task worker1] [--fault-gens 1] [--at 5]

Counts steps (reported to the launcher with `runtime.report_progress`), keeps
the last step in `MGPU_CHECKPOINT_DIR/step` (written by the chief) and resumes
from it: prints `RESUME gen=G step=S` at start and `DONE step=S` at the end.
`--fault` makes `--fault-task` misbehave at step `--at` in generations below
`--fault-gens`: `silent` stops printing and reporting (a hang), `exit42` asks
to be restarted.
"""

import argparse
import os
import sys
import time

from launcher import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--step-s", type=float, default=0.1)
parser.add_argument("--fault", choices=["none", "silent", "exit42"], default="none")
parser.add_argument("--fault-task", default="worker1")
parser.add_argument("--fault-gens", type=int, default=1)
parser.add_argument("--at", type=int, default=5)
args = parser.parse_args()

me = f"{runtime.task_type()}{runtime.task_index()}"
generation = int(os.environ.get("MGPU_GENERATION", "0"))
state = os.path.join(runtime.checkpoint_dir(), "step")
os.makedirs(runtime.checkpoint_dir(), exist_ok=True)
try:
    with open(state) as handle:
        start = int(handle.read() or 0)
except OSError:
    start = 0
print(f"RESUME gen={generation} step={start} workers={runtime.num_workers()}", flush=True)
faulty = args.fault != "none" and me == args.fault_task and generation < args.fault_gens
for step in range(start + 1, args.steps + 1):
    if faulty and step >= args.at:
        if args.fault == "exit42":
            print(f"{me}: preempted at step {step}", flush=True)
            sys.exit(42)
        while True:  # silent: no output, no progress, never exits
            time.sleep(60)
    time.sleep(args.step_s)
    print(f"step {step}", flush=True)
    if runtime.is_chief():
        with open(state + ".tmp", "w") as handle:
            handle.write(str(step))
        os.replace(state + ".tmp", state)
        runtime.report_checkpoint(step)  # saved: a restart after this is progress
    else:
        runtime.report_progress(step)
print(f"DONE step={args.steps}", flush=True)
