"""Transports are siblings: each one has every method of the declared
`launcher.transport.Transport` protocol, with the same parameters, and the
protocol declares every method the launch and `check` call on a transport.

The calls are read from the launcher's source with `ast` (a call on a name
`transport` outside launcher/transport/), so a new call to a method one
transport lacks fails here, not on a user's cluster. The transports are every
`*Transport` class in `launcher/transport/`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import queue
import sys
from pathlib import Path

import pytest

from launcher.spec.plan import HostTarget
from launcher.transport import Transport
from launcher.transport.local import LocalTransport

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "launcher"


def _declared() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(member) for name, member in vars(Transport).items()
            if not name.startswith("_") and callable(member)}


def _transport_classes() -> list[str]:
    found = []
    for path in sorted((PACKAGE / "transport").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if (isinstance(node, ast.ClassDef) and node.name.endswith("Transport")
                    and node.name != "Transport"):
                found.append(f"launcher.transport.{path.stem}:{node.name}")
    return found


def _calls_on_transports() -> dict[str, str]:
    """Method name -> where it is first called on a `transport` by the launcher
    outside launcher/transport/ (inside, `transport` is also paramiko's)."""
    calls: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "transport":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "transport"):
                where = f"{path.relative_to(REPO)}:{node.lineno}"
                calls.setdefault(node.func.attr, where)
    return calls


def test_the_protocol_declares_every_method_the_launch_calls():
    calls = _calls_on_transports()
    assert {"connect", "connect_each", "time_command"} <= set(calls)  # the scan finds them
    undeclared = {name: where for name, where in calls.items() if name not in _declared()}
    assert not undeclared, f"called on a transport but not in `Transport`: {undeclared}"


@pytest.mark.parametrize("spec", _transport_classes())
def test_every_transport_has_every_method_of_the_protocol(spec: str):
    module, name = spec.split(":")
    cls = getattr(importlib.import_module(module), name)
    for method, declared in _declared().items():
        assert callable(getattr(cls, method, None)), f"{name} lacks `{method}`"
        actual = inspect.signature(getattr(cls, method))
        assert list(actual.parameters) == list(declared.parameters), (
            f"{name}.{method}{actual} differs from Transport.{method}{declared}")
        defaults = {p.name: p.default for p in actual.parameters.values()}
        assert defaults == {p.name: p.default for p in declared.parameters.values()}, (
            f"{name}.{method}{actual}: defaults differ from Transport.{method}{declared}")


def test_the_scan_finds_the_three_transports():
    names = {spec.split(":")[1] for spec in _transport_classes()}
    assert {"LocalTransport", "SSHTransport", "SlurmTransport"} <= names


def _target(name: str, python: str) -> HostTarget:
    return HostTarget(name=name, address="127.0.0.1", python=python, gpus=(), ssh_user=None,
                      ssh_port=22, identity_file=None, known_hosts="~/.ssh/known_hosts",
                      host_key_policy="strict", ssh_config_file=None, connect_timeout_s=10.0)


def test_local_connect_each_keeps_the_hosts_that_work(tmp_path: Path):
    """As over SSH: a host whose Python is missing is a problem named for that
    host, and the other host's agent still answers."""
    transport = LocalTransport(cache_root=tmp_path / "cache")
    events: queue.Queue = queue.Queue()
    missing = str(tmp_path / "no-such-python")
    links, problems = transport.connect_each(
        [_target("good", sys.executable), _target("bad", missing)], str(tmp_path / "run"), events)
    try:
        assert list(links) == ["good"]
        assert links["good"].hello is not None
        assert [p.host for p in problems] == ["bad"]
        assert missing in problems[0].reason and "`python:`" in problems[0].reason
    finally:
        for link in links.values():
            link.close()
        transport.close()


def test_local_time_command_times_a_command_and_reports_failure(tmp_path: Path):
    transport = LocalTransport(cache_root=tmp_path / "cache")
    seconds = transport.time_command("any-host")
    assert seconds is not None and 0 <= seconds < 30
    assert transport.time_command("any-host", "exit 3") is None
    assert transport.time_command("any-host", "sleep 5", timeout=0.2) is None
