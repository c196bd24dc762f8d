"""A job without TensorFlow that prints far more than a terminal pipe holds.

    chatty.py LINES_IN_LAST_GENERATION [LAST_GENERATION]

Each task prints bursts of long lines. In generations below LAST_GENERATION
(default 1) it keeps printing until it is killed (at most 120 s); in the last
one it prints LINES_IN_LAST_GENERATION lines, then `DONE`, and exits 0.
"""

import os
import sys
import time

lines = int(sys.argv[1])
last_generation = int(sys.argv[2]) if len(sys.argv) > 2 else 1
generation = int(os.environ.get("MGPU_GENERATION", "0"))
me = os.environ.get("MGPU_TASK_TYPE", "worker") + os.environ.get("MGPU_TASK_INDEX", "0")
filler = "x" * 300
deadline = time.monotonic() + 120  # never outlive a broken test
n = 0
while (generation >= last_generation and n < lines) or \
        (generation < last_generation and time.monotonic() < deadline):
    for _ in range(50):
        n += 1
        print(f"{me} gen {generation} line {n} {filler}")
    sys.stdout.flush()
    time.sleep(0.05)
print(f"{me} DONE", flush=True)
