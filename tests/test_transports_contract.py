"""Transports are siblings: each one has every method of the declared
`launcher.transport.Transport` protocol, with the same parameters, and the
protocol declares every method the launch and `check` call on a transport.

The calls are read from the launcher's source with `ast`, outside
launcher/transport/: a call on any name typed `Transport` (a parameter, a
variable or a field annotated so, whatever it is called) or bound to
`make_transport(...)`, so a new call to a method one transport lacks fails
here, not on a user's cluster. The transports are every `*Transport` class in
`launcher/transport/`.
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


def _is_protocol(annotation: ast.expr | None) -> bool:
    """`Transport`, `Transport | None`, `"Transport"`: the protocol (not one
    transport's class: `SSHTransport.time_command` is its own)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return any(isinstance(node, ast.Name) and node.id == "Transport"
               for node in ast.walk(annotation))


def _transport_names(tree: ast.AST) -> set[str]:
    """The names (and fields) that hold a transport in `tree`."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and _is_protocol(node.annotation):
            names.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and _is_protocol(node.annotation):
            target = node.target
            names.add(target.attr if isinstance(target, ast.Attribute) else target.id)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and isinstance(node.value.func, ast.Name) and node.value.func.id == "make_transport"):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _calls_on(tree: ast.AST, names: set[str]) -> dict[str, int]:
    """Method name -> the first line it is called on one of `names` (`x.m()` or `a.x.m()`)."""
    calls: dict[str, int] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = node.func.value
        name = receiver.id if isinstance(receiver, ast.Name) else \
            receiver.attr if isinstance(receiver, ast.Attribute) else None
        if name in names:
            line = calls.setdefault(node.func.attr, node.lineno)
            calls[node.func.attr] = min(line, node.lineno)
    return calls


def _calls_on_transports() -> dict[str, str]:
    """Method name -> where it is first called on a transport by the launcher
    outside launcher/transport/ (inside, `transport` is also paramiko's)."""
    trees = {path: ast.parse(path.read_text()) for path in sorted(PACKAGE.rglob("*.py"))
             if path.parent.name != "transport"}
    names = set().union(*(_transport_names(tree) for tree in trees.values()))
    calls: dict[str, str] = {}
    for path, tree in trees.items():
        for method, line in _calls_on(tree, names).items():
            calls.setdefault(method, f"{path.relative_to(REPO)}:{line}")
    return calls


def test_the_scan_finds_a_call_whatever_the_variables_name():
    tree = ast.parse("""
def launch(link: Transport | None, first):
    link.frobnicate(first)

class Held:
    via: "Transport"

def later(held: Held):
    held.via.reconnect()
    made = make_transport(config)
    made.warm_up()
""")
    assert set(_calls_on(tree, _transport_names(tree))) == {"frobnicate", "reconnect", "warm_up"}


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
