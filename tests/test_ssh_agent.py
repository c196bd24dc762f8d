"""Logging in with the keys of ssh-agent (no `identity_file:`), against real
OpenSSH sshds on loopback and a real `ssh-agent`.

paramiko's agent client is not thread-safe; when every parallel handshake
signed through one shared agent connection, requests and replies interleaved
and most launches on 16 hosts failed with "authentication ... rejected".
Agent failures must read as agent failures, naming SSH_AUTH_SOCK.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import os
import queue
import socket
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.spec.config import load_config
from launcher.spec.plan import HostTarget, host_targets
from launcher.tools.sshsim import generate_key
from launcher.transport import TransportError, ssh_auth
from launcher.transport.ssh import SSHTransport
from launcher.transport.ssh_connect import Connector
from launcher.transport.ssh_endpoint import Refused
from tests.conftest import run_cli
from tests.sshcluster import MARKER, agent_add, sim_cluster, ssh_agent, write_script, write_yaml

HOSTS = 16
ROUNDS = 5  # before the fix most launches failed: five rounds show it every time


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), HOSTS) as sim:
        yield sim


@pytest.fixture(scope="module")
def agent_yaml(cluster, tmp_path_factory) -> Path:
    """The cluster's YAML without `identity_file:` (how most people log in)."""
    config = cluster.config_dict()
    del config["ssh"]["identity_file"]
    return write_yaml(tmp_path_factory.mktemp("yaml") / "cluster.yaml", config)


@pytest.fixture(scope="module")
def agent_sock(cluster) -> Iterator[str]:
    """A real ssh-agent holding the simulated cluster's client key."""
    with ssh_agent() as sock:
        agent_add(sock, cluster.client_key)
        yield sock


def _targets(yaml_path: Path) -> tuple[HostTarget, ...]:
    return host_targets(load_config(yaml_path).config, "python3")


def _connect_all(targets, run_dir: str) -> list[str]:
    """Connect and start an agent on every host once; the problems ([] when all came up)."""
    transport = SSHTransport()
    try:
        links = transport.connect(targets, run_dir, queue.Queue())
        for link in links.values():  # first: closing the transport waits for the agents
            link.close()
    except TransportError as exc:
        return [str(p) for p in exc.problems]
    finally:
        transport.close()
    return []


# --------------------------------------------------------------------- 16 hosts, 5 times


def test_without_the_agent_no_host_lets_us_in(agent_yaml, agent_sock, tmp_path, monkeypatch):
    """The control: no key file the launcher finds on its own (~/.ssh/id_*) is
    accepted, so in the test below the agent's key is what logs in."""
    targets = _targets(agent_yaml)
    assert len(targets) == HOSTS and all(t.identity_file is None for t in targets)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    problems = _connect_all(targets, str(tmp_path / "run"))
    assert len(problems) == HOSTS and all("rejected" in p for p in problems), problems
    assert not any("ssh-agent" in p for p in problems), problems


def test_a_job_on_sixteen_hosts_with_ssh_agent_keys_runs_every_time(
        agent_yaml, agent_sock, tmp_path):
    script = write_script(tmp_path, "marker.py", MARKER)
    failed: dict[int, str] = {}
    for attempt in range(ROUNDS):
        markers = tmp_path / f"markers{attempt}"
        markers.mkdir()
        done = run_cli(["--run-dir", str(tmp_path / f"run{attempt}"), str(agent_yaml),
                        str(script), str(markers)], cwd=tmp_path, SSH_AUTH_SOCK=agent_sock)
        ran = sorted(p.name for p in markers.iterdir())
        if done.returncode != 0 or ran != sorted(f"host{i}" for i in range(HOSTS)):
            failed[attempt] = f"exit {done.returncode}, ran on {len(ran)}: {done.stderr[-1500:]}"
    assert not failed, (f"{len(failed)} of {ROUNDS} jobs failed; the first: "
                        f"{next(iter(failed.values()))}")


# --------------------------------------------------------------------- agent failures


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


@contextlib.contextmanager
def broken_agent(public_key: Path, fails: str) -> Iterator[str]:
    """A stand-in for ssh-agent that fails as a real one can, where a real one
    cannot be made to on cue: "close-on-list" hangs up at once, "close-on-sign"
    lists `public_key` and hangs up on the signing request (an agent that died
    meanwhile), "mute-on-sign" lists it and never answers (one waiting for a
    confirmation). Yields its socket path."""
    blob = base64.b64decode(public_key.read_text().split()[1])
    folder = tempfile.mkdtemp(prefix="mgpu-fake-agent-")
    path = os.path.join(folder, "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    conns: list[socket.socket] = []

    def handle(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while True:
                head = b"" if fails == "close-on-list" else _recv_exactly(conn, 4)
                body = _recv_exactly(conn, struct.unpack(">I", head)[0]) if head else b""
                if not body or (body[0] == 13 and fails == "close-on-sign"):
                    conn.shutdown(socket.SHUT_RDWR)
                    return
                if body[0] == 11:  # REQUEST_IDENTITIES -> IDENTITIES_ANSWER
                    reply = b"\x0c" + struct.pack(">I", 1) + _string(blob) + _string(b"fake")
                    conn.sendall(_string(reply))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield path
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()
        os.unlink(path)
        os.rmdir(folder)


def _open_first_host(agent_yaml: Path, **changes) -> str:
    """Open a connection to host0 alone in this process: "" or the refusal."""
    target = dataclasses.replace(_targets(agent_yaml)[0], **changes)
    connector = Connector()
    try:
        transport, _ = connector.open(target)
    except Refused as exc:
        return str(exc)
    finally:
        connector.close()
    transport.close()
    return ""


@pytest.fixture
def no_key_files(tmp_path, monkeypatch) -> None:
    """An empty home: the default ~/.ssh/id_* keys do not exist."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("kind", ["nowhere", "refuses", "close-on-list", "close-on-sign",
                                  "mute-on-sign"])
def test_an_agent_failure_is_reported_as_one_naming_ssh_auth_sock(
        cluster, agent_yaml, tmp_path, monkeypatch, capfd, no_key_files, kind):
    monkeypatch.setattr(ssh_auth, "AGENT_TIMEOUT_S", 0.5)  # for "mute-on-sign"
    public = Path(f"{cluster.client_key}.pub")
    blob = base64.b64decode(public.read_text().split()[1])
    fingerprint = "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    host = cluster.hosts[0]
    signing = ("ssh-agent at SSH_AUTH_SOCK={sock} could not sign for "
               f"{cluster.user}@{host.address}:{host.port} with ssh-ed25519 {fingerprint}: ")
    expected = {
        "nowhere": "cannot reach ssh-agent at SSH_AUTH_SOCK={sock} (No such file or directory), "
                   "so none of its keys were tried",
        "refuses": signing + "the agent refused to sign",
        "close-on-list": "ssh-agent at SSH_AUTH_SOCK={sock} did not list its keys: the "
                         "connection to the agent broke",
        "close-on-sign": signing + "the connection to the agent broke (lost ssh-agent)",
        "mute-on-sign": signing + "no answer within 0.5 s",
    }[kind]
    with contextlib.ExitStack() as stack:
        if kind == "nowhere":
            sock = str(tmp_path / "gone" / "agent.sock")
        elif kind == "refuses":
            # A real agent: a key added with -c needs a confirmation nobody can give.
            sock = stack.enter_context(ssh_agent())
            agent_add(sock, cluster.client_key, "-c")
        else:
            sock = stack.enter_context(broken_agent(public, kind))
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        message = _open_first_host(agent_yaml)
    assert expected.format(sock=sock) in message, message
    assert "ssh-add -l" in message and "identity_file:" in message
    assert "rejected" not in message
    assert "Traceback" not in capfd.readouterr().err  # said once, in words


def test_a_key_file_still_logs_in_when_the_agent_is_unreachable(
        cluster, agent_yaml, tmp_path, monkeypatch, no_key_files):
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "gone.sock"))
    assert _open_first_host(agent_yaml, identity_file=str(cluster.client_key)) == ""


def test_an_agent_key_logs_in_after_a_rejected_key_file(
        cluster, agent_yaml, agent_sock, tmp_path, monkeypatch, no_key_files):
    stranger = tmp_path / "stranger_key"
    generate_key(stranger, "stranger")  # the hosts do not know it
    monkeypatch.setenv("SSH_AUTH_SOCK", agent_sock)
    assert _open_first_host(agent_yaml, identity_file=str(stranger)) == ""


def test_an_empty_agent_is_mentioned_when_no_key_is_accepted(
        cluster, agent_yaml, monkeypatch, no_key_files):
    with ssh_agent() as sock:
        monkeypatch.setenv("SSH_AUTH_SOCK", sock)
        message = _open_first_host(agent_yaml)
    assert f"rejected by {cluster.hosts[0].address}" in message, message
    assert f"tried no key at all (the ssh-agent at SSH_AUTH_SOCK={sock} holds no keys" in message
