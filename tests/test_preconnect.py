"""The hosts' TCP connections opened first thing (launcher/commands/preconnect.py)
and taken by the SSH connector once the cluster file is read, against real
OpenSSH sshds on loopback: each host's connection is the early one, a socket
the connector cannot use is closed, a host that refuses is named as before."""

from __future__ import annotations

import argparse
import copy
import queue
import socket

import pytest

from launcher.cli import _run_parser
from launcher.commands import preconnect
from launcher.spec.config import load_config
from launcher.spec.plan import host_targets
from launcher.transport import TransportError
from launcher.transport.ssh import SSHTransport
from tests.sshcluster import sim_cluster, write_yaml


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


@pytest.fixture(autouse=True)
def nothing_left_open():
    yield
    preconnect.close_all()


def test_the_option_tables_are_the_run_parsers():
    """preconnect reads argv before the parser exists: its tables must match it."""
    values, flags = set(), set()
    for action in _run_parser()._actions:
        if not action.option_strings:
            continue
        takes_value = action.nargs != 0 and not isinstance(
            action, argparse._StoreTrueAction | argparse._StoreFalseAction
            | argparse._VersionAction | argparse._HelpAction)
        (values if takes_value else flags).update(action.option_strings)
    stops = preconnect.NOT_A_RUN
    assert values - stops == preconnect.VALUE_OPTIONS
    assert flags - stops == preconnect.FLAGS
    assert {"--local", "--slurm", "--dry-run", "--detach", "--help", "--version"} <= stops


def test_only_a_plain_run_with_a_cluster_file_is_read(tmp_path):
    cluster_file = tmp_path / "c.yaml"
    cluster_file.write_text("hosts: [{address: 127.0.0.2}]\n")
    path = str(cluster_file)
    run = preconnect._cluster_file
    assert run([path, "train.py"]) == path
    assert run(["-q", "--run-dir", "x.yaml", path, "train.py"]) == path
    assert run(["--run-dir=r", "--", path, "train.py"]) == path
    for argv in (["--dry-run", path, "t.py"], ["--detach", path, "t.py"],
                 ["--local", "2", "t.py"], ["check", path], ["--new-flag", path, "t.py"],
                 ["train.py", path], [str(tmp_path / "missing.yaml"), "t.py"]):
        assert run(argv) is None, argv


def connect(config: dict, tmp_path, hosts: slice = slice(None)
            ) -> tuple[dict, SSHTransport, list]:
    """The run command's order: the early sockets, the file read, the adoption
    (of the sockets for `hosts` of the file's)."""
    yaml_path = write_yaml(tmp_path / "cluster.yaml", config)
    preconnect.start([str(yaml_path), "train.py"])
    early = dict(preconnect._opened)
    targets = list(host_targets(load_config(yaml_path).config, "python3"))[hosts]
    ssh = SSHTransport()
    ssh.adopt(preconnect.take(), targets)
    return early, ssh, targets


def test_each_host_is_reached_over_its_early_connection(cluster, tmp_path):
    config = copy.deepcopy(cluster.config_dict())
    port = config["ssh"]["port"]
    # Not a host of the file: its socket is never handed over, and closed.
    stray = socket.socket()
    stray.setblocking(False)
    stray.connect_ex(("127.0.0.2", port))
    early, ssh, targets = connect(config, tmp_path)
    assert set(early) == {(h.address, port) for h in cluster.hosts}
    local_ends = {key: sock.getsockname() for key, sock in early.items()}
    links = ssh.connect(targets, str(tmp_path / "run"), queue.Queue())
    try:
        assert set(links) == {"host0", "host1"}
        used = {session.transport.sock.getsockname() for session in ssh._sessions}
        assert used == set(local_ends.values())  # the early sockets, no new ones
    finally:
        for link in links.values():
            link.close()
        ssh.close()
    stray.close()


def test_a_socket_the_connector_cannot_use_is_closed_at_once(cluster, tmp_path):
    config = copy.deepcopy(cluster.config_dict())
    port = config["ssh"]["port"]
    early, ssh, _ = connect(config, tmp_path, hosts=slice(0, 1))  # host0's taken only
    assert early[("127.0.0.3", port)].fileno() == -1  # host1's: closed at once
    assert early[("127.0.0.2", port)].fileno() != -1
    ssh.abort()  # a launch that ends before its connect: the rest closed too
    assert early[("127.0.0.2", port)].fileno() == -1


def test_a_host_that_refuses_is_named_as_before(cluster, tmp_path):
    config = copy.deepcopy(cluster.config_dict())
    config["hosts"].append({"address": "127.0.0.250", "name": "ghost"})
    early, ssh, targets = connect(config, tmp_path)
    assert ("127.0.0.250", config["ssh"]["port"]) in early
    with pytest.raises(TransportError) as caught:
        ssh.connect(targets, str(tmp_path / "run"), queue.Queue())
    assert [p.host for p in caught.value.problems] == ["ghost"]
    assert "connection refused by 127.0.0.250" in caught.value.problems[0].reason
    ssh.close()


def test_no_early_socket_through_an_ssh_config_that_could_reroute(cluster, tmp_path):
    config = copy.deepcopy(cluster.config_dict())
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host 127.0.0.2\n    ProxyJump 127.0.0.3\n")
    config["ssh"]["config_file"] = str(ssh_config)
    early, ssh, _ = connect(config, tmp_path)
    assert early == {}
    ssh.abort()
