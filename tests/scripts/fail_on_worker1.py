"""Worker 1 raises after a moment; worker 0 waits to be stopped. No TensorFlow."""

import json
import os
import time


def load_settings(path):
    with open(path) as handle:
        return json.load(handle)


index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
print(f"worker {index} up", flush=True)
if index == 1:
    load_settings("/nonexistent/settings.json")
while True:
    time.sleep(0.2)
