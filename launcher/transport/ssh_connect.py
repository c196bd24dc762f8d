"""Opening SSH connections (paramiko): where a host is, whether its key is
known, and who we are to it.

Owns: resolving how to reach a host (YAML + ssh config: HostName, User, Port,
IdentityFile, ProxyJump), verifying its host key against known_hosts, public
key authentication (identity files and ssh-agent, one agent connection per
handshake), jump hosts. `Connector.open` returns an authenticated transport or
raises `Refused` with the whole reason; an agent that fails is named as such
(SSH_AUTH_SOCK), never passed off as a key the host rejected.

Security: a host key is never accepted silently (no AutoAddPolicy): `strict`
refuses unknown keys, `accept-new` records them, a changed key is refused
under every policy.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import getpass
import glob
import hashlib
import os
import re
import shlex
import socket
import threading
from dataclasses import dataclass, field

from ..spec.plan import HostTarget
from ._paramiko import paramiko

# Channel opens + handshakes at once through one jump host: a bastion's sshd
# drops connections past its MaxStartups (10 by default), and we stay well under.
JUMP_CONCURRENCY = 8
KEEPALIVE_S = 5  # keeps NAT/firewall state alive and surfaces dead peers to TCP
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


class Refused(Exception):
    """A host could not be used; the message is the full reason for the user."""


# ---------------------------------------------------------------- where and who


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


# ---------------------------------------------------------------- host keys


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` exactly as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class KnownHosts:
    """known_hosts files, loaded once per connect; accept-new appends under a lock."""

    def __init__(self) -> None:
        self._files: dict[str, paramiko.HostKeys] = {}
        self._lock = threading.Lock()

    def _load(self, path: str) -> paramiko.HostKeys:
        with self._lock:
            if path not in self._files:
                keys = paramiko.HostKeys()
                if os.path.exists(path):
                    keys.load(path)
                self._files[path] = keys
            return self._files[path]

    def known_types(self, ep: Endpoint) -> list[str]:
        entry = self._load(ep.known_hosts).lookup(ep.known_hosts_name)
        return list(entry.keys()) if entry else []

    def verify(self, ep: Endpoint, key: paramiko.PKey) -> None:
        """Return if `key` is the host's known key (or newly accepted); raise Refused."""
        keys = self._load(ep.known_hosts)
        entry = keys.lookup(ep.known_hosts_name)
        offered = f"{key.get_name()} key {fingerprint(key)}"
        if entry:
            if entry.get(key.get_name()) == key:
                return
            known = ", ".join(f"{name} {fingerprint(k)}" for name, k in entry.items())
            raise Refused(
                f"HOST KEY CHANGED for {ep.known_hosts_name}: it offered {offered}, but "
                f"{ep.known_hosts} holds {known}. Someone may be intercepting the connection, "
                "or the host was reinstalled; refused under every host_key_policy. If the "
                f"change is expected: `ssh-keygen -f {shlex.quote(ep.known_hosts)} -R "
                f"{shlex.quote(ep.known_hosts_name)}` and then `{ep.keyscan_command()}`"
            )
        if ep.policy != "accept-new":
            raise Refused(
                f"unknown host key: {ep.known_hosts_name} offered {offered}, and "
                f"{ep.known_hosts} has no entry for it (host_key_policy: strict). If that "
                f"fingerprint is the host's, record it: `{ep.keyscan_command()}`, or set "
                "`host_key_policy: accept-new` to record new hosts on first contact"
            )
        self._record(ep, key)

    def _record(self, ep: Endpoint, key: paramiko.PKey) -> None:
        line = f"{ep.known_hosts_name} {key.get_name()} {key.get_base64()}\n"
        directory = os.path.dirname(ep.known_hosts) or "."
        with self._lock:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            fd = os.open(ep.known_hosts, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a") as handle:
                # Another launcher may append at the same moment.
                fcntl.flock(handle, fcntl.LOCK_EX)
                handle.write(line)
            self._load_locked(ep.known_hosts).add(ep.known_hosts_name, key.get_name(), key)

    def _load_locked(self, path: str) -> paramiko.HostKeys:
        return self._files.setdefault(path, paramiko.HostKeys())


# ---------------------------------------------------------------- authentication


class Identities:
    """Private keys from files, parsed once; the agent's keys come per handshake."""

    def __init__(self) -> None:
        self._keys: dict[str, paramiko.PKey | str] = {}
        self._lock = threading.Lock()

    def candidates(self, ep: Endpoint, agent: AgentSession
                   ) -> tuple[list[tuple[str, paramiko.PKey]], list[str]]:
        """(name, key) pairs to try, and notes on keys that could not be used."""
        files = list(ep.identity_files) or [os.path.expanduser(p) for p in DEFAULT_IDENTITIES]
        pairs: list[tuple[str, paramiko.PKey]] = []
        notes: list[str] = []
        for path in files:
            loaded = self._file_key(path, explicit=bool(ep.identity_files))
            if isinstance(loaded, str):
                if loaded:
                    notes.append(loaded)
            else:
                pairs.append((path, loaded))
        for key in agent.keys:
            pairs.append((f"ssh-agent {key.get_name()} {fingerprint(key)}", key))
        if agent.path and not agent.keys and not agent.problem:
            notes.append(f"the ssh-agent at SSH_AUTH_SOCK={agent.path} holds no keys "
                         "(`ssh-add -l`; add yours with `ssh-add KEY`)")
        return pairs, notes

    def _file_key(self, path: str, explicit: bool) -> paramiko.PKey | str:
        with self._lock:
            if path not in self._keys:
                try:
                    self._keys[path] = paramiko.PKey.from_path(path)
                except FileNotFoundError:
                    self._keys[path] = f"{path} does not exist" if explicit else ""
                except paramiko.PasswordRequiredException:
                    self._keys[path] = (f"{path} is encrypted: add it to ssh-agent "
                                        f"(`ssh-add {shlex.quote(path)}`)")
                except (OSError, paramiko.SSHException, ValueError) as exc:
                    self._keys[path] = f"{path} is not a usable private key ({exc})"
            return self._keys[path]


# Below paramiko's own auth timeout (30 s), so a silent agent is named as such
# rather than ending in paramiko's "Authentication timeout.".
AGENT_TIMEOUT_S = 20.0
AGENT_FIX = ("`ssh-add -l` shows whether SSH_AUTH_SOCK reaches a running agent and which "
             "keys it holds; start one and add your key (`eval \"$(ssh-agent -s)\"; ssh-add "
             "KEY`) in the shell that launches, or set `identity_file:` for this host")


class _AgentFailed(EOFError):
    """Signing through ssh-agent failed; `_AgentKey.failure` says how.

    An EOFError because paramiko's transport thread ends a handshake on one
    quietly, where any other exception is logged with a traceback on stderr;
    `Connector._authenticate` reports the failure in words instead.
    """


class _AgentKey(paramiko.AgentKey):
    """A key of one handshake's own agent connection that remembers why signing failed."""

    def __init__(self, agent: paramiko.agent.AgentSSH, blob: bytes, comment: str) -> None:
        super().__init__(agent, blob, comment)  # type: ignore[arg-type]
        self.failure: str | None = None
        self.signing = False  # a request is out: still set when paramiko's auth timeout hits

    def sign_ssh_data(self, data: bytes, algorithm: str | None = None) -> bytes:
        self.signing = True
        try:
            return super().sign_ssh_data(data, algorithm)
        except Exception as exc:  # runs in paramiko's transport thread: keep the reason
            self.failure = _agent_failure(exc)
            raise _AgentFailed(self.failure) from None
        finally:
            self.signing = False


def _agent_failure(exc: Exception, signing: bool = True) -> str:
    if isinstance(exc, TimeoutError):
        return (f"no answer within {AGENT_TIMEOUT_S:g} s: is it waiting for a confirmation "
                "(a key added with `ssh-add -c`) or a hardware key touch?")
    if isinstance(exc, OSError | EOFError) or "lost ssh-agent" in str(exc):
        return (f"the connection to the agent broke ({exc or type(exc).__name__}): "
                "is it still running?")
    if not signing:
        return f"it answered with an error ({exc or type(exc).__name__})"
    # paramiko's "key cannot be used for signing": the agent answered SSH_AGENT_FAILURE.
    return ("the agent refused to sign: was the key added with `ssh-add -c` and its "
            "confirmation declined or impossible (no ssh-askpass), or the agent locked "
            "meanwhile (`ssh-add -X` unlocks it)?")


class AgentSession:
    """One handshake's own connection to ssh-agent (`SSH_AUTH_SOCK`).

    Not one connection shared by all handshakes: paramiko's agent client is not
    thread-safe, and parallel handshakes on one socket interleave their
    requests and replies (wrong signatures, "lost ssh-agent"); a lock would
    serialise them, but one stream left mid-reply by a timeout would still
    poison every later request. A connection costs ~0.2 ms (0.04 ms of CPU)
    against ~10 ms for the SSH handshake itself, and is what each `ssh` does.
    """

    def __init__(self) -> None:
        self.path = os.environ.get("SSH_AUTH_SOCK", "")
        self.keys: list[_AgentKey] = []
        self.problem: str | None = None  # why the agent's keys could not be listed
        self._sock: socket.socket | None = None
        if not self.path:
            return
        where = f"SSH_AUTH_SOCK={self.path}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(AGENT_TIMEOUT_S)
        try:
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self.problem = f"cannot reach ssh-agent at {where} ({exc.strerror or exc})"
            return
        self._sock = sock
        agent = paramiko.agent.AgentSSH()
        try:
            agent._connect(sock)  # sends REQUEST_IDENTITIES on our socket
        except Exception as exc:  # whatever it was, this agent is of no use
            self.close()
            self.problem = (f"ssh-agent at {where} did not list its keys: "
                            f"{_agent_failure(exc, signing=False)}")
            return
        self.keys = [_AgentKey(agent, key.blob, key.comment) for key in agent.get_keys()]

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            # shutdown wakes a transport thread still blocked on a reply; close would not.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


# ---------------------------------------------------------------- connections


@dataclass
class _Jump:
    transport: paramiko.Transport
    gate: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(
        JUMP_CONCURRENCY))


class Connector:
    """Opens authenticated paramiko transports, through jump hosts when configured."""

    def __init__(self, default_user: str | None = None) -> None:
        self.configs = SSHConfigs()
        self.known_hosts = KnownHosts()
        self.identities = Identities()
        self.default_user = default_user or getpass.getuser()
        self._jumps: dict[tuple, _Jump] = {}
        self._jump_locks: dict[tuple, threading.Lock] = {}
        self._lock = threading.Lock()
        self._handshaking: dict[paramiko.Transport, socket.socket | paramiko.Channel] = {}
        self._aborted = False

    def endpoint(self, host: HostTarget) -> Endpoint:
        options = self.configs.lookup(host.ssh_config_file, host.address)
        return merge_endpoint(host, options, self.default_user)

    def open(self, host: HostTarget) -> tuple[paramiko.Transport, Endpoint]:
        ep = self.endpoint(host)
        if not ep.proxy_jump:
            return self._open(ep, None), ep
        jump = self._jump(host, ep.proxy_jump)
        with jump.gate:
            try:
                channel = jump.transport.open_channel(
                    "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0),
                    timeout=ep.timeout_s)
            except (paramiko.SSHException, OSError) as exc:
                raise Refused(f"jump host {ep.proxy_jump} could not reach "
                              f"{ep.hostname}:{ep.port}: {exc}") from None
            return self._open(ep, channel), ep

    def _jump(self, host: HostTarget, spec: str) -> _Jump:
        """The shared connection to the last hop of `spec` (hops separated by commas)."""
        hops = [h.strip() for h in spec.split(",") if h.strip()]
        chain: tuple = ()
        jump: _Jump | None = None
        for hop in hops:
            chain += (hop,)
            with self._lock:
                lock = self._jump_locks.setdefault(chain, threading.Lock())
            with lock:  # one thread connects a jump host; the others reuse it
                existing = self._jumps.get(chain)
                if existing is not None and existing.transport.is_active():
                    jump = existing
                    continue
                ep = self._hop_endpoint(host, hop)
                try:
                    sock = None
                    if jump is not None:
                        sock = jump.transport.open_channel(
                            "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0),
                            timeout=ep.timeout_s)
                    jump = _Jump(self._open(ep, sock))
                except Refused as exc:
                    raise Refused(f"jump host {hop}: {exc}") from None
                except (paramiko.SSHException, OSError) as exc:
                    raise Refused(f"jump host {hop}: {exc}") from None
                self._jumps[chain] = jump
        assert jump is not None
        return jump

    def _hop_endpoint(self, host: HostTarget, hop: str) -> Endpoint:
        user, name, port = parse_jump(hop)
        options = self.configs.lookup(host.ssh_config_file, name)
        if options.pop("proxycommand", None):
            raise Refused(f"the ssh config gives jump host {name} a ProxyCommand, which "
                          "mgpu-launch does not run: chain the hops in the target's "
                          f"ProxyJump instead (`ProxyJump OUTER,{hop}`)")
        # The hop shares the target's keys, known_hosts and policy.
        base = dataclasses.replace(host, name=f"jump host {hop}", address=name, ssh_user=user,
                                   ssh_port=port or 22)
        ep = merge_endpoint(base, options, self.default_user)
        # A hop's own ProxyJump would need recursion; chains go in one spec instead.
        return dataclasses.replace(ep, proxy_jump=None)

    def _open(self, ep: Endpoint, sock: paramiko.Channel | None) -> paramiko.Transport:
        where = f"{ep.hostname}:{ep.port}"
        if sock is None:
            sock = _tcp_connect(ep)
        transport = paramiko.Transport(sock)
        with self._lock:
            if self._aborted:
                sock.close()
                raise Refused("the launcher is stopping")
            self._handshaking[transport] = sock
        try:
            transport.set_keepalive(KEEPALIVE_S)
            known = self.known_hosts.known_types(ep)
            if known:
                # Ask for the key type we already hold, as OpenSSH does, so a
                # host with several keys is checked against the one on file.
                options = transport.get_security_options()
                preferred = [t for t in options.key_types if _base_type(t) in known]
                rest = [t for t in options.key_types if t not in preferred]
                options.key_types = preferred + rest
            try:
                transport.start_client(timeout=ep.timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise Refused(f"SSH handshake with {where} failed: {exc or type(exc).__name__}"
                              ) from None
            self.known_hosts.verify(ep, transport.get_remote_server_key())
            self._authenticate(transport, ep)
            if self._aborted:
                raise Refused("the launcher is stopping")
            return transport
        except BaseException:
            transport.close()
            raise
        finally:
            with self._lock:
                self._handshaking.pop(transport, None)

    def _authenticate(self, transport: paramiko.Transport, ep: Endpoint) -> None:
        agent = AgentSession()  # this handshake's own: see AgentSession
        try:
            self._try_keys(transport, ep, agent)
        finally:
            agent.close()

    def _try_keys(self, transport: paramiko.Transport, ep: Endpoint,
                  agent: AgentSession) -> None:
        keys, notes = self.identities.candidates(ep, agent)
        tried = []
        for name, key in keys:
            try:
                transport.auth_publickey(ep.user, key)
            except paramiko.AuthenticationException:
                _raise_if_agent_failed(key, name, agent, ep)
                tried.append(name)
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                _raise_if_agent_failed(key, name, agent, ep)
                raise Refused(f"authentication with {ep.hostname}:{ep.port} broke off: {exc}"
                              ) from None
            if transport.is_authenticated():
                return
        extra = f" ({'; '.join(notes)})" if notes else ""
        if agent.problem:
            # The key the hosts expect may well be in that agent: say so first,
            # not "rejected" (a rejection would send the user to fix the hosts).
            also = f"; keys tried and rejected: {', '.join(tried)}" if tried else ""
            raise Refused(f"authentication as {ep.user!r} on {ep.hostname}:{ep.port} failed: "
                          f"{agent.problem}, so none of its keys were tried{also}{extra}. "
                          f"{AGENT_FIX}")
        what = ", ".join(tried) if tried else "no key at all"
        first = next((k for k in tried if not k.startswith("ssh-agent")), "KEY")
        raise Refused(
            f"authentication as {ep.user!r} rejected by {ep.hostname}:{ep.port}: tried "
            f"{what}{extra}. Install your public key on the host (`ssh-copy-id -i "
            f"{shlex.quote(first)}.pub -p {ep.port} {ep.user}@{ep.hostname}`) or set "
            "`identity_file:` / `user:` for this host"
        )

    def abort(self) -> None:
        """End every handshake in progress now (Ctrl-C must not wait for a hung
        sshd to time out); connections opened later are refused. For good: the
        launcher is stopping. (A TCP connect still waiting for its SYN-ACK ends
        within `connect_timeout_s`; its thread does not hold up the exit.)"""
        with self._lock:
            self._aborted = True
            pending = list(self._handshaking.items())
        for transport, sock in pending:
            # paramiko's close() does nothing before start_client has begun:
            # shutting the socket down ends a handshake at any point.
            with contextlib.suppress(OSError):
                if isinstance(sock, socket.socket):
                    sock.shutdown(socket.SHUT_RDWR)
                else:
                    sock.close()
            transport.close()

    def close(self) -> None:
        self.abort()
        with self._lock:
            jumps, self._jumps = list(self._jumps.values()), {}
        for jump in jumps:
            jump.transport.close()


def _raise_if_agent_failed(key: paramiko.PKey, name: str, agent: AgentSession,
                           ep: Endpoint) -> None:
    """An attempt with an agent key that failed in the agent, not at the host:
    raise Refused naming SSH_AUTH_SOCK (the handshake is over either way)."""
    if not isinstance(key, _AgentKey) or not (key.failure or key.signing):
        return
    why = key.failure or _agent_failure(TimeoutError())
    raise Refused(f"ssh-agent at SSH_AUTH_SOCK={agent.path} could not sign for "
                  f"{ep.user}@{ep.hostname}:{ep.port} with {name.removeprefix('ssh-agent ')}: "
                  f"{why} {AGENT_FIX}")


def _base_type(algorithm: str) -> str:
    # RSA keys are filed as ssh-rsa whichever signature algorithm is negotiated.
    return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm


def _tcp_connect(ep: Endpoint) -> socket.socket:
    where = f"{ep.hostname}:{ep.port}"
    try:
        sock = socket.create_connection((ep.hostname, ep.port), timeout=ep.timeout_s)
    except socket.gaierror as exc:
        raise Refused(f"cannot resolve {ep.hostname!r} ({exc.strerror}): check the address "
                      "or the HostName of your ssh config") from None
    except ConnectionRefusedError:
        raise Refused(f"connection refused by {where}: is sshd running there, and is the "
                      "port right (`port:` in the YAML)?") from None
    except TimeoutError:
        raise Refused(f"no answer from {where} within {ep.timeout_s:g} s "
                      "(connect_timeout_s): host down or firewalled?") from None
    except OSError as exc:
        raise Refused(f"cannot connect to {where}: {exc.strerror or exc}") from None
    # Small JSON lines both ways: Nagle would hold each one back (52 -> 10 ms auth).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock
