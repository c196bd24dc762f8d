"""docker/ built and run for real: the worker image from docker/Dockerfile, built by
podman on a base made from Debian's packages (tests/podman.py), once per session.

- Two containers of it are SSH hosts to the launcher (run here, as a user's
  machine would): the bundled example trains on them to the end; a kill -9 of the
  training task inside one container is recovered from the shared checkpoints.
- The compose file's cluster (docker/docker-compose.yml, through podman-compose):
  its keygen service, its three hosts, and the launcher run inside node1 as the
  docs say, training the example on node1..node3 by their names.

podman, runc, mmdebstrap and podman-compose are in .ci/run's apt-get line; a
machine without them fails here, naming them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests import podman as pm
from tests.conftest import read_events, read_summary, start_cli, wait_for

pytestmark = pytest.mark.e2e
EXAMPLE = "examples/digits/train.py"  # inside the image, under its workdir


@pytest.fixture(scope="session")
def built(tmp_path_factory) -> pm.Built:
    missing = pm.missing_tools()
    assert not missing, (f"{', '.join(missing)} not installed: `apt-get install podman runc "
                         "mmdebstrap podman-compose` (.ci/run does)")
    assert os.geteuid() == 0, "the containers run under rootful podman (CI runs as root)"
    return pm.build_image(tmp_path_factory.mktemp("image"))


def test_the_image_has_what_the_docs_promise(built: pm.Built) -> None:
    done = pm.podman(built.env, "run", "--rm", built.image, "sh", "-c",
                     "mgpu-launch --help >/dev/null && python3 -c 'import tensorflow, "
                     "tf_keras, launcher.podstart; print(tensorflow.__version__)' "
                     "&& /usr/sbin/sshd -V 2>&1 | head -1 && id mgpu", timeout=120)
    assert done.stdout.splitlines()[0].startswith("2."), done.stdout
    assert "uid=" in done.stdout
    print(f"\nimage build: base {built.base_s and round(built.base_s)} s "
          f"(None: cached), image {built.build_s:.0f} s")


class Hosts:
    """Containers of the worker image serving SSH, with one shared checkpoint dir."""

    def __init__(self, built: pm.Built, work: Path, count: int) -> None:
        self.built, self.work = built, work
        self.prefix = f"mgpu-test-{secrets.token_hex(3)}"
        self.keys, self.ckpt = work / "keys", work / "ckpt"
        self.keys.mkdir()
        self.ckpt.mkdir(mode=0o777)
        self.ckpt.chmod(0o777)  # the tasks run as the image's user
        pm.podman(built.env, "run", "--rm", "-v", f"{self.keys}:/keys", built.image, "keygen")
        self.names = [f"{self.prefix}-node{i}" for i in range(count)]
        for name in self.names:
            pm.podman(built.env, "run", "-d", "--name", name, "--hostname", name,
                      "-v", f"{self.keys}:/keys:ro", "-v", f"{self.ckpt}:/shared/ckpt",
                      built.image, "sshd")
        self.ips = [pm.podman(built.env, "inspect", "-f", "{{.NetworkSettings.IPAddress}}",
                              name).stdout.strip() for name in self.names]
        # The launcher's known_hosts: the one host key, under each container's address.
        key = (self.keys / "ssh_host_ed25519_key.pub").read_text().split()[:2]
        (work / "known_hosts").write_text(f"{','.join(self.ips)} {' '.join(key)}\n")
        for ip in self.ips:
            wait_for(lambda ip=ip: _ssh_banner(ip), timeout=30, what=f"sshd on {ip}")

    def cluster_yaml(self) -> Path:
        config = {
            "name": "podman-digits", "transport": "ssh", "python": "python3",
            "workdir": "/opt/mgpu-launch", "env": {"TF_CPP_MIN_LOG_LEVEL": "2"},
            "ssh": {"user": "mgpu", "identity_file": str(self.keys / "id_ed25519"),
                    "known_hosts": str(self.work / "known_hosts"),
                    "host_key_policy": "strict"},
            "hosts": [{"address": ip} for ip in self.ips],
            "checkpoint": {"dir": "/shared/ckpt/digits"},
            "restart": {"max_restarts": 2, "backoff_s": 0},
            "ports": {"base": 23456},
        }
        path = self.work / "cluster.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def close(self) -> None:
        for name in self.names:
            pm.podman(self.built.env, "rm", "-f", "-t", "0", name, check=False)


def _ssh_banner(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=1) as sock:
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture
def hosts(built: pm.Built, tmp_path: Path) -> Iterator[Hosts]:
    cluster = Hosts(built, tmp_path, 2)
    try:
        yield cluster
    finally:
        cluster.close()


def test_two_containers_train_the_example_and_recover_a_kill_9(hosts: Hosts,
                                                               tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = start_cli(["--no-live", "--run-dir", str(run_dir), str(hosts.cluster_yaml()),
                     EXAMPLE, "--epochs", "5"], tmp_path)
    try:
        # Past the first epoch's checkpoint, in generation 0: kill worker1's task
        # inside its container, as the OOM killer would.
        started = wait_for(lambda: [e for e in read_events(run_dir)
                                    if e["event"] == "progress" and e["task"] == "worker1"
                                    and e.get("epoch", 0) >= 1], timeout=240,
                           what="worker1 in its second epoch")
        pid = next(e["pid"] for e in read_events(run_dir)
                   if e["event"] == "task_started" and e["task"] == "worker1")
        pm.podman(hosts.built.env, "exec", hosts.names[1], "kill", "-9", str(pid))
        assert started
        output, _ = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 0, output[-4000:]
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    assert summary["root_cause"] is None
    [failure] = summary["failures"]
    assert failure["task"].endswith("worker1") and failure.get("signal") in (9, "SIGKILL"), \
        failure
    # Generation 1 resumed from the checkpoint in the shared volume, not from step 1.
    [resumed] = [e for e in read_events(run_dir) if e["event"] == "resumed"]
    assert resumed["generation"] == 1 and resumed["step"] >= 22, resumed  # an epoch's steps
    assert "test accuracy" in output
    assert list((hosts.ckpt / "digits").iterdir())


def test_the_compose_cluster_trains_the_example(built: pm.Built, tmp_path: Path) -> None:
    """docker/docker-compose.yml as the docs run it, through podman-compose."""
    assert shutil.which("podman-compose"), "podman-compose not installed (.ci/run installs it)"
    compose = pm.REPO / "docker" / "docker-compose.yml"
    project = f"mgpu{secrets.token_hex(3)}"
    env = {**built.env, "MGPU_WORKER_IMAGE": built.image}

    def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["podman-compose", "-p", project, "-f", str(compose), *args],
                              env=env, capture_output=True, text=True, timeout=timeout)

    try:
        # keygen first, to the end (podman-compose 1.0 does not wait for
        # `service_completed_successfully`), then the three hosts.
        done = run("run", "--rm", "keygen")
        assert done.returncode == 0, done.stdout + done.stderr
        done = run("up", "-d", "--no-deps", "node1", "node2", "node3")
        assert done.returncode == 0, done.stdout + done.stderr
        # The memory tier's room: 1 GB of /dev/shm, not a container's 64 MB.
        shm = run("exec", "-T", "node1", "df", "-k", "--output=size", "/dev/shm")
        size = re.search(r"1K-blocks\s+(\d+)", shm.stdout)  # podman-compose says more around it
        assert size and int(size.group(1)) >= 1_000_000, shm.stdout + shm.stderr
        start = time.monotonic()
        done = run("exec", "-T", "-u", "mgpu", "node1", "mgpu-launch", "--no-live",
                   "docker/cluster.yaml", EXAMPLE, "--epochs", "1", timeout=300)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert "job succeeded" in done.stdout and "node3/worker2" in done.stdout
        print(f"\ncompose cluster: trained in {time.monotonic() - start:.0f} s")
    finally:
        run("down", "-v", timeout=180)
        # podman-compose 1.0 leaves the project's network behind.
        pm.podman(built.env, "network", "rm", "-f", f"{project}_cluster", check=False)
