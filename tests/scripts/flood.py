"""A task (no TensorFlow) that prints as fast as it can.

    flood.py OUT_DIR MIB LINE_BYTES [FOREVER_INDEX]

Prints MIB MiB of LINE_BYTES-byte lines, writes the time it is done to
OUT_DIR/<task>.done (a float, Unix time) and exits 0. The task whose index is
FOREVER_INDEX prints on instead (at most 120 s) until it is stopped.
"""

import os
import sys
import time

out_dir, mib, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
forever = sys.argv[4] if len(sys.argv) > 4 else None
index = os.environ.get("MGPU_TASK_INDEX", "0")
me = os.environ.get("MGPU_TASK_TYPE", "worker") + index
line = f"{me} {'x' * (size - len(me) - 2)}\n"
chunk = (line * (2**20 // size)).encode()  # ~1 MiB
deadline = time.monotonic() + 120
sent = 0
while sent < mib or (index == forever and time.monotonic() < deadline):
    sys.stdout.buffer.write(chunk)
    sent += 1
sys.stdout.buffer.flush()
with open(os.path.join(out_dir, f"{me}.done"), "w") as handle:
    handle.write(repr(time.time()))
