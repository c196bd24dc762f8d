"""Helpers for tests against simulated SSH hosts (real OpenSSH sshds on loopback).

Test modules build module-scoped fixtures from `sim_cluster(...)`; the CLI is
always run for real, in a subprocess, with tests.conftest's `run_cli`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.tools.sshsim import SimCluster, start_cluster

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


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class NetnsLink:
    """A network namespace joined to this one by a veth pair: a host with its own link."""

    netns: str
    outside: str  # this side's address (another host can use it)
    inside: str  # the namespace's address
    inner_if: str

    def cut(self) -> None:
        """Unplug the cable: the namespace's end goes down; nothing gets through,
        and nobody is told (no RST, no FIN). This side's route stays (linkdown),
        so packets for the namespace never leave for another network."""
        _ip("netns", "exec", self.netns, "ip", "link", "set", self.inner_if, "down")

    def restore(self) -> None:
        _ip("netns", "exec", self.netns, "ip", "link", "set", self.inner_if, "up")


def netns_available() -> str:
    """"" when network namespaces can be made here, else why not."""
    probe = f"mgpu-probe-{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ""


@contextlib.contextmanager
def netns_link() -> Iterator[NetnsLink]:
    """A fresh namespace and a veth pair on a private /30 (10.213.N.0/30, a
    subnet no interface here uses). An `unreachable` route for the /30 with a
    high metric makes sure its traffic can never take the default route, even
    if the veth vanished. Everything is removed afterwards.
    """
    tag = secrets.token_hex(3)
    netns, outer, inner = f"mgpu-{tag}", f"mgv{tag}o", f"mgv{tag}i"
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    subnet = next(n for n in range(int(tag[:2], 16), int(tag[:2], 16) + 256)
                  if f" 10.213.{n % 256}." not in used) % 256
    outside, inside, prefix = f"10.213.{subnet}.1", f"10.213.{subnet}.2", f"10.213.{subnet}.0/30"
    _ip("netns", "add", netns)
    try:
        _ip("route", "add", "unreachable", prefix, "metric", "4000")
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", netns)
        _ip("addr", "add", f"{outside}/30", "dev", outer)
        _ip("link", "set", outer, "up")
        for command in (["addr", "add", f"{inside}/30", "dev", inner],
                        ["link", "set", inner, "up"], ["link", "set", "lo", "up"]):
            _ip("netns", "exec", netns, "ip", *command)
        yield NetnsLink(netns, outside, inside, inner)
    finally:
        subprocess.run(["ip", "link", "del", outer], capture_output=True)
        subprocess.run(["ip", "route", "del", "unreachable", prefix, "metric", "4000"],
                       capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


# ssh-agent would ask for a confirmation (`ssh-add -c`) on a display: never here.
_NO_ASKPASS = ("DISPLAY", "WAYLAND_DISPLAY", "SSH_ASKPASS", "SSH_ASKPASS_REQUIRE")


@contextlib.contextmanager
def ssh_agent() -> Iterator[str]:
    """A private OpenSSH `ssh-agent` on its own socket; yields that SSH_AUTH_SOCK.

    The socket goes into a fresh folder under /tmp (a unix socket's path is at
    most 107 bytes, which pytest's tmp_path can exceed). With no display and no
    askpass, the agent refuses to sign with a key added by `ssh-add -c` (a
    confirmation nobody can give). Killed, and its folder removed, at the end.
    """
    folder = tempfile.mkdtemp(prefix="mgpu-agent-")
    sock = os.path.join(folder, "agent.sock")
    env = {k: v for k, v in os.environ.items() if k not in _NO_ASKPASS}
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    try:
        # Its first line (`SSH_AUTH_SOCK=...; export SSH_AUTH_SOCK;`) comes once
        # the socket listens; on failure it exits and the line is its error.
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("SSH_AUTH_SOCK="):
            raise RuntimeError(f"ssh-agent did not start: {line.strip()}")
        yield sock
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def agent_add(sock: str, key: Path, *options: str) -> None:
    """`ssh-add [options] key` into the agent at `sock`."""
    subprocess.run(["ssh-add", *options, str(key)], env={**os.environ, "SSH_AUTH_SOCK": sock},
                   check=True, capture_output=True, text=True)
