"""Helpers for tests against simulated SSH hosts (real OpenSSH sshds on loopback).

Test modules build module-scoped fixtures from `sim_cluster(...)`; the CLI is
always run for real, in a subprocess, with tests.conftest's `run_cli`.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

from launcher.sshsim import SimCluster, start_cluster

# A tiny MultiWorkerMirroredStrategy job: prints a digest of its final weights,
# which must be identical on every worker.
TINY_TRAIN = """\
import hashlib, os
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import numpy as np
import tensorflow as tf
from launcher import runtime

tf.keras.utils.set_random_seed(0)
strategy = runtime.strategy()
x = np.random.default_rng(0).normal(size=(128, 4)).astype("float32")
y = x @ np.array([1.0, -2.0, 3.0, 0.5], dtype="float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8 * strategy.num_replicas_in_sync)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
data = data.with_options(options)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
model.fit(data, epochs=2, steps_per_epoch=3, verbose=0)
weights = np.concatenate([w.numpy().ravel() for w in model.weights])
print("weights digest", hashlib.sha256(weights.tobytes()).hexdigest()[:16], flush=True)
"""

# Not TensorFlow: a task (and a grandchild) that only sleep, for connection tests.
SLEEPER = """\
import os, subprocess, sys, time
child = subprocess.Popen(["sleep", "300"])
print("sleeping", os.getpid(), child.pid, flush=True)
time.sleep(300)
"""

# Proves a task ran: it leaves a marker file.
MARKER = """\
import os, pathlib, sys
pathlib.Path(sys.argv[1], os.environ["MGPU_HOST"]).write_text("ran")
"""


@contextlib.contextmanager
def sim_cluster(directory: Path, count: int, **kwargs) -> Iterator[SimCluster]:
    cluster = start_cluster(count, directory, sys.executable, **kwargs)
    try:
        yield cluster
    finally:
        cluster.stop()


def write_yaml(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def write_script(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def make_venv(directory: Path, fake_versions: dict[str, str] | None = None) -> Path:
    """A bare venv (no pip, no TensorFlow) whose metadata may claim fake versions.

    `fake_versions` ({"tensorflow": "2.20.0"}) writes only a `*.dist-info/METADATA`
    per package: enough for `importlib.metadata.version`, which is all the agent
    and `check` read; importing the package would fail. Returns its python.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True)
    python = directory / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    for name, version in (fake_versions or {}).items():
        info = Path(site.stdout.strip()) / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return python
