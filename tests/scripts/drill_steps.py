"""A cheap job without TensorFlow for `mgpu-launch drill`: good and bad resume habits.

    drill_steps.py [--steps 400] [--step-s 0.05] [--save-every 5] [--save-s 0.1]
                   [--no-restore] [--sigterm-save-s S] [--ignore-sigterm]

Counts steps (reported with `runtime.report_progress`). Every `--save-every`
steps the chief saves the step to `MGPU_CHECKPOINT_DIR/step` (the save takes
`--save-s`) and reports it (`runtime.report_checkpoint`); 0: never saves. At
start it resumes from that file, unless `--no-restore` (it saves, never
restores). With `--sigterm-save-s S` SIGTERM makes every worker save, taking
S seconds, then exit 42; with `--ignore-sigterm` it trains on (a preemption
then ends in SIGKILL after the grace); without either SIGTERM ends the process.
"""

import argparse
import os
import signal
import sys
import time

from launcher import runtime

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--step-s", type=float, default=0.05)
parser.add_argument("--save-every", type=int, default=5)
parser.add_argument("--save-s", type=float, default=0.1)
parser.add_argument("--no-restore", action="store_true")
parser.add_argument("--sigterm-save-s", type=float, default=None)
parser.add_argument("--ignore-sigterm", action="store_true")
args = parser.parse_args()

state = os.path.join(runtime.checkpoint_dir(), "step")
os.makedirs(runtime.checkpoint_dir(), exist_ok=True)
step = 0
if not args.no_restore:
    try:
        with open(state) as handle:
            step = int(handle.read() or 0)
    except OSError:
        pass


def save(seconds: float) -> None:
    time.sleep(seconds)
    if runtime.is_chief():
        with open(state + ".tmp", "w") as handle:
            handle.write(str(step))
        os.replace(state + ".tmp", state)


def on_sigterm(_signum, _frame) -> None:
    print(f"SIGTERM at step {step}: saving", flush=True)
    save(args.sigterm_save_s)
    if runtime.is_chief():
        runtime.report_checkpoint(step)
    sys.exit(42)


if args.sigterm_save_s is not None:
    signal.signal(signal.SIGTERM, on_sigterm)
elif args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"START step={step}", flush=True)
while step < args.steps:
    time.sleep(args.step_s)
    step += 1
    if args.save_every and step % args.save_every == 0:
        save(args.save_s)
        if runtime.is_chief():
            runtime.report_checkpoint(step)
        else:
            runtime.report_progress(step)
    else:
        runtime.report_progress(step)
print(f"DONE step={step}", flush=True)
