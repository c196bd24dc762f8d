"""`mgpu-launch check` against simulated SSH hosts (real sshds on loopback)."""

from __future__ import annotations

import re
import socket

import pytest

from tests.conftest import run_cli
from tests.sshcluster import make_venv, sim_cluster, write_yaml


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


def check(config_or_path, tmp_path):
    path = (config_or_path if not isinstance(config_or_path, dict)
            else write_yaml(tmp_path / "cluster.yaml", config_or_path))
    return run_cli(["check", str(path)], cwd=tmp_path, timeout=120)


def test_a_good_cluster_passes(cluster, tmp_path):
    done = check(cluster.yaml_path, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[1][:3] == ["host0", "127.0.0.2", "ok"]
    assert rows[2][:3] == ["host1", "127.0.0.3", "ok"]
    assert "shared," in rows[1] and "1/1" in rows[1]  # nonce seen; the peer's port reached
    # LOGIN: one `true` over each host's connection, the login shell's rc files included.
    assert rows[0][-1] == "LOGIN"
    assert all(re.fullmatch(r"\d+\.\d\ds", row[-1]) for row in rows[1:3]), rows
    assert "verdict: ready" in done.stdout
    # Nothing is left behind in the checkpoint dir.
    assert not list((cluster.dir / "checkpoints").glob(".mgpu-check-*"))


def test_a_busy_port_fails_naming_host_and_port(cluster, tmp_path):
    port = cluster.port_base + 1  # host1's worker
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen()
        done = check(cluster.yaml_path, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"host1: port {port} is busy" in done.stdout
    assert "host0: port" not in done.stdout
    assert "verdict: NOT READY" in done.stdout


def test_differing_tensorflow_versions_fail(cluster, tmp_path):
    # host1's python is a venv whose metadata claims TensorFlow 2.20.0 (and the
    # matching tf-keras): what the agent and check read, without installing it.
    python = make_venv(tmp_path / "old-tf", {"tensorflow": "2.20.0", "tf-keras": "2.20.0",
                                             "keras": "3.15.1"})
    config = cluster.config_dict()
    config["hosts"][1]["python"] = str(python)
    done = check(config, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "host1: TensorFlow 2.20.0 here, but 2.21.0 on host0" in done.stdout
    assert "host0: TensorFlow" not in done.stdout


def test_an_unreachable_host_is_a_failed_row(cluster, tmp_path):
    config = cluster.config_dict()
    config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
    done = check(config, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ghost: connection refused by 127.0.0.250" in done.stdout
    assert any(line.split()[:3] == ["ghost", "127.0.0.250", "FAILED"]
               for line in done.stdout.splitlines())


def test_a_checkpoint_dir_that_is_not_shared_fails(tmp_path_factory, tmp_path):
    # host1's sshd runs in its own mount namespace with an empty tmpfs over the
    # checkpoint dir: the same path, a different directory, as on two machines
    # without a shared filesystem.
    directory = tmp_path_factory.mktemp("sim-private").resolve()
    checkpoints = str(directory / "checkpoints")
    with sim_cluster(directory, 2, private_mounts={1: (checkpoints,)}) as sim:
        done = check(sim.yaml_path, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"host1: checkpoint dir {checkpoints} is not shared" in done.stdout
    assert "written there from host0" in done.stdout


def test_a_slow_login_shell_is_noted_without_failing_the_check():
    from launcher.job.plan import HostTarget
    from launcher.ops.check import HostReport, render

    host = HostTarget(name="gpu1", address="10.0.0.1", python="python3", gpus=(),
                      ssh_user=None, ssh_port=22, identity_file=None,
                      known_hosts="~/.ssh/known_hosts", host_key_policy="strict",
                      ssh_config_file=None, connect_timeout_s=10.0)
    report = HostReport(host, hello={"python_version": "3.11.7",
                                     "packages": {"tensorflow": "2.21.0"}},
                        checkpoint={"exists": True, "nonce_seen": True, "free_gb": 9},
                        login_s=2.46)
    text = render([report], "/ckpt", ports_fixed=False)
    assert "gpu1: every SSH command waits 2.5 s for the login shell" in text
    assert "2.46s" in text.splitlines()[1]
    assert text.splitlines()[-1].startswith("verdict: ready")
