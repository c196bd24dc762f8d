"""The ports the host's tasks listen on (launcher/agent/listening.py), found as
they open, and told the other hosts (`ports_opened` -> `seal_ports`)."""

from __future__ import annotations

import os
import socket

import pytest

from launcher.agent import listening
from launcher.agent.listening import RECHECK_S, Listening, listening_sockets
from launcher.agent.protocol import BadCommand, targets
from launcher.job.run.protocol import BadMessage, check_message
from tests.fake_agents import harness


def test_a_listening_socket_is_the_tasks_only_when_one_of_their_processes_holds_it():
    found = Listening(lambda: 0.0)

    def tasks() -> set[int]:
        return {os.getpid()}

    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_server(("::1", 0), family=socket.AF_INET6) as six:
        port, port6 = server.getsockname()[1], six.getsockname()[1]
        # The kernel's sock_diag (what a poll asks) and /proc/net/tcp{,6} (where that fails)
        for found_now in (listening_sockets(), listening._proc_listening()):
            assert {port, port6} <= set(found_now.values())
        by_inode = listening._proc_listening()
        assert {i: p for i, p in listening._diag_listening().items() if p in (port, port6)} == {
            i: p for i, p in by_inode.items() if p in (port, port6)}
        assert {port, port6} <= found.ports(tasks)
        assert port not in Listening(lambda: 0.0).ports(set)  # no task holds it: another's
        # A connected (not listening) socket is no port of theirs.
        with socket.create_connection(("127.0.0.1", port)) as client:
            assert client.getsockname()[1] not in found.ports(tasks)
    assert port not in found.ports(tasks)  # closed: gone


def test_a_socket_judged_anothers_is_judged_again_in_its_first_seconds_only():
    now = [0.0]
    found = Listening(lambda: now[0])
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert port not in found.ports(set)  # not yet known as the tasks' (a new child)
        now[0] = RECHECK_S / 2
        assert port in found.ports(lambda: {os.getpid()})
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert port not in found.ports(set)
        now[0] += RECHECK_S + 1
        assert port not in found.ports(lambda: {os.getpid()})  # another's for good


def test_seal_ports_takes_address_port_pairs_only():
    assert targets([["10.0.0.2", 40000], ["gpu2", 1]]) == [("10.0.0.2", 40000), ("gpu2", 1)]
    for bad in ([["10.0.0.2", 0]], [["a b", 1]], [["x", True]], "10.0.0.2", [["-x", 1]]):
        with pytest.raises(BadCommand):
            targets(bad)
    assert check_message({"ev": "ports_opened", "ports": [40000]})["ports"] == [40000]
    for bad in ([], [70000], None):
        with pytest.raises(BadMessage):
            check_message({"ev": "ports_opened", "ports": bad})


def test_the_supervisor_tells_the_other_hosts_the_ports_a_hosts_tasks_opened(tmp_path):
    def script(generation: int, name: str):
        opened = [(1.0, "ports_opened", {"ports": [41000, 41001]})] if name == "worker1" else []
        return [*opened, (5.0, "exit", {"code": 0})]

    h = harness(tmp_path, script)
    assert h.supervisor.run().status == "succeeded"
    told = [m for m in h.links["host0"].sent if m["op"] == "seal_ports"]
    address = next(t.address for t in h.supervisor.current.plan.tasks if t.host == "host1")
    assert told == [{"op": "seal_ports", "targets": [[address, 41000], [address, 41001]]}]
    assert not [m for m in h.links["host1"].sent if m["op"] == "seal_ports"]  # not its own
    # A new agent (a host back after a loss) hears them at its hello.
    h.supervisor._runner._on_hello("host0", {})  # noqa: SLF001
    assert [m for m in h.links["host0"].sent if m["op"] == "seal_ports"] == told * 2
