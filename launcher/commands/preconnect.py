"""The SSH hosts' TCP connections, opened first thing: while the launcher's
modules load (~0.2 s of one core: pydantic, paramiko), each host's sshd accepts
and starts its session on the cores that import leaves idle.

Only for a plain run over SSH (`mgpu-launch [OPTIONS] CLUSTER.yaml SCRIPT ...`:
no `--dry-run`, `--detach`, `--local`, `--slurm` nor subcommand), a cluster
file under MAX_FILE_BYTES read with the config's own guards (launcher.spec.yamldoc),
at most MAX_HOSTS hosts whose address is an IP literal (no name is resolved
here), and no ssh config file that could send a host through a proxy. Nothing
is sent on these sockets. Once the file is validated the SSH connector takes
one only for a host it reaches directly at that very address and port
(`Connector.adopt`); the rest are closed then. A file that is not valid, or
anything unexpected here, means no early sockets: the config's checks speak.

Imports nothing heavy (the yamldoc guards, socket); of the launcher, spec.yamldoc.
"""

from __future__ import annotations

import os
import socket

MAX_FILE_BYTES = 256 * 1024  # a 32-host file is ~2 KB; a 10,000-host one is parsed once only
MAX_HOSTS = 64  # the SSH transport's MAX_PARALLEL: the connections it opens at once
# The run parser's options (launcher/cli.py; tests/test_preconnect.py keeps them
# equal): those that take a value, the flags, and those after which nothing connects.
VALUE_OPTIONS = frozenset({"--task", "--run-dir", "--max-restarts", "--metrics-port"})
FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose", "--no-live", "--json"})
NOT_A_RUN = frozenset({"--dry-run", "--detach", "--local", "--slurm", "-h", "--help",
                       "--version"})
_PROXY_WORDS = (b"proxy", b"include", b"match")  # ssh config lines that could reroute

_opened: dict[tuple[str, int], socket.socket] = {}


def start(argv: list[str]) -> None:
    """Open the connections for this command line, if it is a plain SSH run."""
    try:
        path = _cluster_file(argv)
        if path is None or os.stat(path).st_size > MAX_FILE_BYTES:
            return
        for address, port in _direct_hosts(path):
            _open(address, port)
    except Exception:  # noqa: BLE001 - an optimisation only: the config's checks speak
        close_all()


def take() -> dict[tuple[str, int], socket.socket]:
    """The sockets opened, by (address, port); each is the taker's to close."""
    taken = dict(_opened)
    _opened.clear()
    return taken


def close_all() -> None:
    for sock in take().values():
        sock.close()


def _cluster_file(argv: list[str]) -> str | None:
    """The cluster file of `[OPTIONS] CLUSTER.yaml SCRIPT ...`, else None."""
    args = iter(argv)
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in NOT_A_RUN:
            return None
        if arg == "--":
            arg = next(args, "")
        elif arg.startswith("-"):
            if name in VALUE_OPTIONS:
                if "=" not in arg:
                    next(args, None)  # its value
            elif name not in FLAGS:
                return None  # an option this does not know: leave it to the parser
            continue
        return arg if arg.lower().endswith((".yaml", ".yml")) and os.path.isfile(arg) else None
    return None


def _direct_hosts(path: str) -> list[tuple[str, int]]:
    from launcher.spec.yamldoc import load_document

    with open(path, encoding="utf-8") as handle:
        data = load_document(handle.read()).data
    if not isinstance(data, dict) or data.get("transport", "ssh") != "ssh":
        return []
    ssh = data.get("ssh") or {}
    hosts = data.get("hosts")
    if not isinstance(ssh, dict) or not isinstance(hosts, list):
        return []
    config_files = {ssh.get("config_file", "~/.ssh/config")}
    config_files |= {h.get("config_file") for h in hosts if isinstance(h, dict)}
    if any(_may_reroute(name) for name in config_files if name):
        return []
    out = []
    for host in hosts[:MAX_HOSTS]:
        if not isinstance(host, dict):
            continue
        address, port = host.get("address"), host.get("port") or ssh.get("port", 22)
        if isinstance(address, str) and type(port) is int and 0 < port < 65536 \
                and _family(address) is not None:
            out.append((address, port))
    return out


def _may_reroute(config_file: str) -> bool:
    """Could this ssh config send a host through a proxy (or include one that does)?"""
    try:
        with open(os.path.expanduser(config_file), "rb") as handle:
            text = handle.read().lower()
    except FileNotFoundError:
        return False
    return any(word in text for word in _PROXY_WORDS)


def _family(address: str) -> int | None:
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, address)
        except OSError:
            continue
        return family
    return None


def _open(address: str, port: int) -> None:
    if (address, port) in _opened:
        return
    sock = socket.socket(_family(address) or socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.connect_ex((address, port))  # in progress: the connector waits for it
    _opened[(address, port)] = sock
