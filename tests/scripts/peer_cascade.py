"""Two workers, no TensorFlow: worker1 fails (exit 3) once worker0 is up;
worker0, stopped by the launcher's SIGTERM, prints a long traceback-like
cascade, as a peer of a dead MWMS worker does. Knows nothing of mgpu-launch."""

import json
import os
import signal
import sys
import time
from pathlib import Path

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
ready = Path(sys.argv[1])
deadline = time.monotonic() + 60  # never outlive a broken test
if index == 1:
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    print("worker1 fails now", flush=True)
    sys.exit(3)


def cascade(signum, frame):
    print("Traceback (most recent call last):", flush=True)
    for n in range(30):
        print(f"  cascade line {n}: UnavailableError: a peer died", flush=True)
    sys.exit(1)


signal.signal(signal.SIGTERM, cascade)
print("worker0 is up", flush=True)
ready.touch()
while time.monotonic() < deadline:
    time.sleep(0.05)
