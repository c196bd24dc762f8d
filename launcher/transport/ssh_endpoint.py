"""Where a host is and who we are to it: a connection's `Endpoint`.

Owns: resolving how to reach a host from the YAML and the ssh config
(HostName, User, Port, IdentityFile, ProxyJump, `Include`s followed as
OpenSSH reads them), and `Refused`, the error every part of opening a
connection raises with the whole reason for the user. A ProxyCommand is
refused, never guessed around.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import threading
from dataclasses import dataclass

from ..spec.target import HostTarget
from ._paramiko import paramiko


class Refused(Exception):
    """A host could not be used; the message is the full reason for the user."""


@dataclass(frozen=True)
class Endpoint:
    """Everything needed to open one SSH connection, config files applied."""

    label: str  # how messages name it
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    proxy_jump: str | None
    known_hosts: str
    policy: str
    timeout_s: float

    @property
    def known_hosts_name(self) -> str:
        """The name OpenSSH files the key under (`[host]:port` unless port 22)."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    def keyscan_command(self) -> str:
        port = "" if self.port == 22 else f"-p {self.port} "
        return (f"ssh-keyscan {port}{shlex.quote(self.hostname)} >> "
                f"{shlex.quote(self.known_hosts)}")


def merge_endpoint(host: HostTarget, options: dict, default_user: str) -> Endpoint:
    """Combine the YAML's view of a host with its ssh config entry (`options`).

    Precedence: values set in the YAML win, like options on an ssh command line;
    then the ssh config; then OpenSSH's defaults. The YAML's port counts as set
    when it is not 22 (the schema's default).
    """
    if options.get("proxycommand"):  # paramiko turns `ProxyCommand none` into None
        # Connecting directly instead would fail in a confusing way, and with a
        # ProxyJump too, OpenSSH uses whichever comes first: refuse, never guess.
        raise Refused(f"the ssh config gives {host.address} a ProxyCommand, which "
                      "mgpu-launch does not run: use `ProxyJump BASTION` there instead "
                      "(what `ProxyCommand ssh -W %h:%p BASTION` does)")
    files = [host.identity_file] if host.identity_file else []
    files += list(options.get("identityfile", []))
    port = host.ssh_port if host.ssh_port != 22 else int(options.get("port", 22))
    jump = options.get("proxyjump")
    return Endpoint(
        label=host.name,
        hostname=target_hostname(host, options),
        port=port,
        user=host.ssh_user or options.get("user") or default_user,
        identity_files=tuple(os.path.expanduser(f) for f in dict.fromkeys(files)),
        proxy_jump=None if jump in (None, "none") else jump,
        known_hosts=os.path.expanduser(host.known_hosts),
        policy=host.host_key_policy,
        timeout_s=float(host.connect_timeout_s),
    )


def target_hostname(host: HostTarget, options: dict) -> str:
    """The name a connection to `host` goes to: the ssh config's HostName for
    the YAML's address (`options`: its ssh config entry), else the address.
    Behind a ProxyJump it is still the target's name, which the jump host
    resolves. The one answer both the connection and the TF_CONFIG address
    (launcher.transport.resolve) use."""
    return str(options.get("hostname") or host.address)


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """`user@host:port` (user and port optional) -> (user, host, port)."""
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):  # [ipv6]:port
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") else None
    elif rest.count(":") == 1:
        host, port_text = rest.split(":")
        port = int(port_text)
    return user or None, host, port


class SSHConfigs:
    """Parsed ssh config files, read once per path, `Include`s followed."""

    def __init__(self) -> None:
        self._parsed: dict[str, paramiko.SSHConfig | None] = {}
        self._lock = threading.Lock()

    def lookup(self, path: str | None, name: str) -> dict:
        if not path:
            return {}
        path = os.path.expanduser(path)
        with self._lock:
            if path not in self._parsed:
                try:
                    self._parsed[path] = (paramiko.SSHConfig.from_text(read_ssh_config(path))
                                          if os.path.exists(path) else None)
                except (OSError, ValueError, paramiko.ssh_exception.ConfigParseError) as exc:
                    raise Refused(f"cannot read the ssh config {path}: {exc}") from None
            config = self._parsed[path]
        try:
            return dict(config.lookup(name)) if config is not None else {}
        except ImportError as exc:
            if exc.name != "invoke":
                raise
            # paramiko runs `Match exec` through invoke, which _paramiko leaves out.
            raise Refused(f"the ssh config {path} uses `Match exec`, which mgpu-launch does "
                          "not support (paramiko checks it for every host): narrow it with "
                          "`Match host NAME exec ...`, or point `ssh.config_file` at a file "
                          "without it") from None


MAX_INCLUDE_DEPTH = 16  # OpenSSH's own limit
_KEYWORD = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)")
_TOP_LEVEL = "Host *\n"


def read_ssh_config(path: str) -> str:
    """The text of an ssh config file with its `Include` directives expanded.

    paramiko skips `Include` silently, and a host defined in an included file
    (`Include config.d/*`, common nowadays) would then be looked up by its bare
    alias. Expanded as OpenSSH reads it: globs, relative paths under ~/.ssh, and
    an Include inside a Host/Match block counts for that block only (the
    block's line is repeated before and after each included file; at top level,
    `Host *`). A file included inside a block may not open blocks of its own:
    OpenSSH nests those under the outer block, which paramiko cannot express,
    so it is refused rather than misread. Like ssh, files others may write to
    are refused.
    """
    lines: list[str] = []
    _inline(path, 0, lines, _TOP_LEVEL, None)
    return "".join(lines)


def _inline(path: str, depth: int, out: list[str], block: str, scope: str | None) -> None:
    """Append `path`'s lines to `out`. `block`: the Host/Match line in force;
    `scope`: the block line this file was included under (None: top level)."""
    if depth > MAX_INCLUDE_DEPTH:
        raise ValueError(f"Include nested more than {MAX_INCLUDE_DEPTH} deep at {path} "
                         "(does a file include itself?)")
    _check_private(path)
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line if line.endswith("\n") else line + "\n"
            match = _KEYWORD.match(line)
            keyword = match.group(1).lower() if match else ""
            if keyword in ("host", "match"):
                if scope is not None:
                    raise ValueError(
                        f"{path} opens `{line.strip()}` but is included inside "
                        f"`{scope.strip()}`; OpenSSH would nest it under that block, which "
                        "mgpu-launch cannot: include it at top level instead")
                block = line
            if keyword != "include":
                out.append(line)
                continue
            inner_scope = scope if block == _TOP_LEVEL else block
            for pattern in shlex.split(match.group(2), comments=True):
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                for included in sorted(glob.glob(pattern)):
                    out.append(block)  # the file's first lines belong to this block
                    _inline(included, depth + 1, out, block, inner_scope)
            out.append(block)


def _check_private(path: str) -> None:
    info = os.stat(path)
    if info.st_mode & 0o022 or info.st_uid not in (os.getuid(), 0):
        raise ValueError(f"{path} may be written by other users; ssh refuses such a file "
                         f"too (`chmod go-w {shlex.quote(path)}`)")
