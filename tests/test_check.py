"""`mgpu-launch check` against simulated SSH hosts (real sshds on loopback).

The collective part starts real TensorFlow (or JAX) tasks on the job's plan:
a healthy cluster, a port taken on one host, hosts that cannot reach each
other's TF_CONFIG addresses (each in its own network namespace), and, on
simulated local hosts, the parameter_server and keras_distribution probes.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from launcher.commands.script_dirs import checkpoint_dirs
from tests.conftest import run_cli
from tests.sshcluster import make_venv, netns_available, netns_link, sim_cluster, write_yaml


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


def check(config_or_path, tmp_path, *flags: str):
    path = (config_or_path if not isinstance(config_or_path, dict)
            else write_yaml(tmp_path / "cluster.yaml", config_or_path))
    return run_cli(["check", str(path), *flags], cwd=tmp_path, timeout=120)


def task_line(stdout: str, label: str) -> list[str]:
    """The collective's line of one task: label, address, state, details..."""
    return next(line.split() for line in stdout.splitlines()
                if line.split()[:1] == [label])


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
    # The collective ran on the planned addresses and ports: two all-reduce
    # steps whose sums (1 and 2 per replica) every worker saw.
    for index, label in enumerate(("host0/worker0", "host1/worker1")):
        line = task_line(done.stdout, label)
        assert line[1:3] == [f"127.0.0.{2 + index}:{cluster.port_base + index}", "ok"], line
        assert re.search(r"all-reduce x2 over 2 replicas in \d+\.\d\ds: 2, 4$", " ".join(line))
    assert re.search(r"^collective: ok in \d+\.\d s$", done.stdout, re.M), done.stdout
    assert "verdict: ready" in done.stdout
    # Nothing is left behind in the checkpoint dir.
    assert not list((cluster.dir / "checkpoints").glob(".mgpu-check-*"))


def test_a_busy_port_fails_naming_host_and_port(cluster, tmp_path):
    port = cluster.port_base + 1  # host1's worker
    with socket.socket() as holder:
        # As most servers bind: connections of the earlier tests lingering in
        # TIME_WAIT on this port do not stop it; TensorFlow's bind still fails.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("", port))
        holder.listen()
        done = check(cluster.yaml_path, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"host1: port {port} is busy" in done.stdout
    assert "host0: port" not in done.stdout
    # The collective names the task that could not start its server, and
    # stops the other one instead of letting it wait for its peer.
    assert task_line(done.stdout, "host1/worker1")[2] == "FAILED", done.stdout
    assert task_line(done.stdout, "host0/worker0")[2] == "stopped", done.stdout
    assert "collective: FAILED - host1/worker1 failed: UnknownError: Could not start gRPC " \
           "server" in done.stdout
    assert f"host1: collective: worker1 (127.0.0.3:{port}) failed" in done.stdout
    assert "verdict: NOT READY" in done.stdout


def test_differing_tensorflow_versions_fail(cluster, tmp_path):
    # host1's python is a venv whose metadata claims TensorFlow 2.20.0 (and the
    # matching tf-keras): what the agent and check read, without installing it.
    python = make_venv(tmp_path / "old-tf", {"tensorflow": "2.20.0", "tf-keras": "2.20.0",
                                             "keras": "3.15.1"})
    config = cluster.config_dict()
    config["hosts"][1]["python"] = str(python)
    done = check(config, tmp_path, "--no-collective")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "host1: TensorFlow 2.20.0 here, but 2.21.0 on host0" in done.stdout
    assert "host0: TensorFlow" not in done.stdout


def test_an_unreachable_host_is_a_failed_row(cluster, tmp_path):
    config = cluster.config_dict()
    config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
    done = check(config, tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ghost: connection refused by 127.0.0.250" in done.stdout
    assert "collective: skipped - not every host could be reached (ghost)" in done.stdout
    assert any(line.split()[:3] == ["ghost", "127.0.0.250", "FAILED"]
               for line in done.stdout.splitlines())


def test_a_checkpoint_dir_that_is_not_shared_fails(tmp_path_factory, tmp_path):
    # host1's sshd runs in its own mount namespace with an empty tmpfs over the
    # checkpoint dir: the same path, a different directory, as on two machines
    # without a shared filesystem.
    directory = tmp_path_factory.mktemp("sim-private").resolve()
    checkpoints = str(directory / "checkpoints")
    with sim_cluster(directory, 2, private_mounts={1: (checkpoints,)}) as sim:
        done = check(sim.yaml_path, tmp_path, "--no-collective")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"host1: checkpoint dir {checkpoints} is not shared" in done.stdout
    assert "written there from host0" in done.stdout


def test_a_scripts_own_checkpoint_directory_not_shared_is_a_warning(tmp_path_factory,
                                                                     tmp_path):
    # The tutorial's shape: BackupAndRestore into a directory of its own, which
    # host1 sees as an empty folder of its own (its own mount namespace).
    directory = tmp_path_factory.mktemp("sim-backup").resolve()
    backup = str(directory / "backup")
    script = tmp_path / "train.py"
    script.write_text("import os\nimport tensorflow as tf\n"
                      f"cb = tf.keras.callbacks.BackupAndRestore(backup_dir={backup!r})\n"
                      "manager = tf.train.CheckpointManager(ckpt, os.path.join('/', 'shared'))\n")
    assert [d for d, _ in checkpoint_dirs(script)] == [backup, "/shared"]
    Path(backup).mkdir()
    with sim_cluster(directory, 2, private_mounts={1: (backup,)}) as sim:
        done = check(sim.yaml_path, tmp_path, "--no-collective", "--script", str(script))
    assert done.returncode == 0, done.stdout + done.stderr  # a warning, not a failure
    assert (f"host1: warning: the script's checkpoint directory {backup} (BackupAndRestore "
            "(line 3)) is not shared") in done.stdout, done.stdout
    assert "host0: warning" not in done.stdout


def test_a_slow_login_shell_is_noted_without_failing_the_check():
    from launcher.commands.check_verdict import HostReport, render
    from launcher.spec.plan import HostTarget

    host = HostTarget(name="gpu1", address="10.0.0.1", python="python3", gpus=(),
                      ssh_user=None, ssh_port=22, identity_file=None,
                      known_hosts="~/.ssh/known_hosts", host_key_policy="strict",
                      ssh_config_file=None, connect_timeout_s=10.0)
    report = HostReport(host, hello={"python_version": "3.11.7",
                                     "packages": {"tensorflow": "2.21.0"}},
                        checkpoint={"exists": True, "nonce_seen": True, "free_gb": 9,
                                    "memory_free_gb": 12.5},
                        login_s=2.46)
    text = render([report], "/ckpt", ports_fixed=False)
    assert "shared, 9 GB free, memory 12.5 GB" in text  # /dev/shm, for checkpoint.memory
    assert "gpu1: every SSH command waits 2.5 s for the login shell" in text
    assert "2.46s" in text.splitlines()[1]
    assert text.splitlines()[-1].startswith("verdict: ready")


def test_hosts_that_cannot_reach_each_other_fail_within_the_bound(tmp_path_factory, tmp_path):
    # Each host in its own network namespace, linked to this one only: the
    # launcher reaches both over SSH, but neither host has a route to the
    # other's address, as with a firewall between them.
    why = netns_available()
    if why:  # .ci/run runs as root with iproute2: a failure to fix, not a skip
        pytest.fail(f"needs network namespaces (root, iproute2): {why}")
    with netns_link() as link0, netns_link() as link1, sim_cluster(
            tmp_path_factory.mktemp("sim-apart"), 2, addresses=[link0.inside, link1.inside],
            netns={0: link0.netns, 1: link1.netns}) as sim:
        began = time.monotonic()
        done = check(sim.yaml_path, tmp_path, "--collective-timeout", "12")
        took = time.monotonic() - began
    assert done.returncode == 2, done.stdout + done.stderr
    worker0, worker1 = f"{link0.inside}:{sim.port_base}", f"{link1.inside}:{sim.port_base + 1}"
    assert f"host0: cannot reach host1/worker1 at {worker1}, its TF_CONFIG address" \
        in done.stdout
    assert f"host1: cannot reach host0/worker0 at {worker0}" in done.stdout
    # Bounded: the tasks still waiting at the deadline are named, then stopped.
    assert "collective: FAILED - no result within 12 s: host0/worker0, host1/worker1" \
        in done.stdout
    for label, address in (("host0/worker0", worker0), ("host1/worker1", worker1)):
        assert task_line(done.stdout, label)[1:3] == [address, "TIMEOUT"], done.stdout
    assert took < 12 + 30, took


@pytest.mark.parametrize("strategy", ["parameter_server", "keras_distribution"])
def test_the_collective_under_other_strategies_on_local_hosts(tmp_path, strategy):
    roles = ([{"chief": 1, "ps": 1}, {"worker": 2}] if strategy == "parameter_server"
             else [{"worker": 1}, {"worker": 1}])
    config = {"name": "probe", "transport": "local", "strategy": strategy,
              "hosts": [{"address": "127.0.0.1", "name": f"host{i}", "roles": r}
                        for i, r in enumerate(roles)],
              "ports": {"base": "auto"}, "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    if strategy == "keras_distribution":
        config["keras"] = "jax"
    done = check(config, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    if strategy == "parameter_server":
        # The chief reached both workers and the ps: 2 steps per worker, all
        # added into one variable on the ps.
        chief = " ".join(task_line(done.stdout, "host0/chief0"))
        assert " ok " in chief and "4 steps on 2 workers into a variable on 1 ps" in chief
        assert chief.endswith(": 4"), chief
        for label in ("host1/worker0", "host1/worker1", "host0/ps0"):
            assert task_line(done.stdout, label)[2:] == ["ok", "served"], done.stdout
    else:
        for label in ("host0/worker0", "host1/worker1"):
            line = " ".join(task_line(done.stdout, label))
            assert " ok " in line and "all-gather x2 across 2 JAX processes" in line
            assert line.endswith(": 3, 6"), line  # (1 + 2), then 2 x (1 + 2)


def test_a_local_host_that_cannot_start_leaves_the_others_checked(tmp_path):
    """As over SSH (connect_each): the simulated host whose Python is missing is a
    failed row, and the other host is still reached and checked."""
    missing = str(tmp_path / "no-such-python")
    config = {"name": "probe", "transport": "local",
              "hosts": [{"address": "127.0.0.1", "name": "host0", "roles": {"worker": 1}},
                        {"address": "127.0.0.1", "name": "host1", "roles": {"worker": 1},
                         "python": missing}],
              "ports": {"base": "auto"}, "checkpoint": {"dir": str(tmp_path / "ckpt")}}
    done = check(config, tmp_path, "--no-collective")
    assert done.returncode != 0, done.stdout + done.stderr
    rows: dict[str, list[str]] = {}
    for line in done.stdout.splitlines()[1:]:  # the table's rows come first
        rows.setdefault(line.split()[0] if line.split() else "", line.split())
    assert rows["host0"][2] == "ok", done.stdout
    assert rows["host1"][2] != "ok", done.stdout
    assert missing in done.stdout, done.stdout
