"""Real hosts over SSH (paramiko): one agent per host on an exec channel.

Owns: resolving how to reach a host (YAML + ssh config: HostName, User, Port,
IdentityFile, ProxyJump), verifying its host key against known_hosts, public
key authentication (identity files and ssh-agent), uploading the agent bundle
over SFTP into a per-version cache on the host, and starting the agent there
with a plain `exec` (no login shell). Every host is handled at once in a
bounded thread pool; every host that fails is reported, one `HostProblem` each.

Security: a host key is never accepted silently (no AutoAddPolicy): `strict`
refuses unknown keys, `accept-new` records them, a changed key is refused
under every policy. Every value reaching the remote shell is shlex-quoted;
TF_CONFIG travels on the agent's stdin, never on a command line.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import getpass
import hashlib
import io
import json
import os
import queue
import secrets
import shlex
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import paramiko

from ..plan import HostTarget, host_run_dir
from ..shipping import bundle_files, bundle_id
from . import HostProblem, TransportError
from .link import AgentLink, AgentMessage

MAX_PARALLEL = 64  # threads mostly wait on the network; bounded so 500 hosts stay sane
# Channel opens + handshakes at once through one jump host: a bastion's sshd
# drops connections past its MaxStartups (10 by default), and we stay well under.
JUMP_CONCURRENCY = 8
KEEPALIVE_S = 5  # keeps NAT/firewall state alive and surfaces dead peers to TCP
# An agent heartbeats every second: one silent this long is on a dead host or
# behind a cut link, and waiting for its exit status at close would be in vain.
SILENT_AGENT_S = 5.0
HELLO_TIMEOUT_S = 30.0  # cold Python start on a loaded host; no TensorFlow import involved
EXIT_BUNDLE_MISSING = 98  # our probe's exit code: the cache has no bundle of this version
REMOTE_CACHE = ".cache/mgpu-launch/code"  # relative to the remote home directory
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


class _Refused(Exception):
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
    files = [host.identity_file] if host.identity_file else []
    files += list(options.get("identityfile", []))
    port = host.ssh_port if host.ssh_port != 22 else int(options.get("port", 22))
    jump = options.get("proxyjump")
    return Endpoint(
        label=host.name,
        hostname=options.get("hostname", host.address),
        port=port,
        user=host.ssh_user or options.get("user") or default_user,
        identity_files=tuple(os.path.expanduser(f) for f in dict.fromkeys(files)),
        proxy_jump=None if jump in (None, "none") else jump,
        known_hosts=os.path.expanduser(host.known_hosts),
        policy=host.host_key_policy,
        timeout_s=float(host.connect_timeout_s),
    )


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
    """Parsed ssh config files, read once per path."""

    def __init__(self) -> None:
        self._parsed: dict[str, paramiko.SSHConfig | None] = {}
        self._lock = threading.Lock()

    def lookup(self, path: str | None, name: str) -> dict:
        if not path:
            return {}
        path = os.path.expanduser(path)
        with self._lock:
            if path not in self._parsed:
                self._parsed[path] = (paramiko.SSHConfig.from_path(path)
                                      if os.path.exists(path) else None)
            config = self._parsed[path]
        return dict(config.lookup(name)) if config is not None else {}


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
        """Return if `key` is the host's known key (or newly accepted); raise _Refused."""
        keys = self._load(ep.known_hosts)
        entry = keys.lookup(ep.known_hosts_name)
        offered = f"{key.get_name()} key {fingerprint(key)}"
        if entry:
            if entry.get(key.get_name()) == key:
                return
            known = ", ".join(f"{name} {fingerprint(k)}" for name, k in entry.items())
            raise _Refused(
                f"HOST KEY CHANGED for {ep.known_hosts_name}: it offered {offered}, but "
                f"{ep.known_hosts} holds {known}. Someone may be intercepting the connection, "
                "or the host was reinstalled; refused under every host_key_policy. If the "
                f"change is expected: `ssh-keygen -f {shlex.quote(ep.known_hosts)} -R "
                f"{shlex.quote(ep.known_hosts_name)}` and then `{ep.keyscan_command()}`"
            )
        if ep.policy != "accept-new":
            raise _Refused(
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
    """Private keys from files (parsed once) and from ssh-agent."""

    def __init__(self) -> None:
        self._keys: dict[str, paramiko.PKey | str] = {}
        self._agent_keys: list[paramiko.PKey] | None = None
        self._lock = threading.Lock()

    def candidates(self, ep: Endpoint) -> tuple[list[tuple[str, paramiko.PKey]], list[str]]:
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
        for key in self._agent():
            pairs.append((f"ssh-agent {key.get_name()} {fingerprint(key)}", key))
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

    def _agent(self) -> list[paramiko.PKey]:
        with self._lock:
            if self._agent_keys is None:
                self._agent_keys = []
                if os.environ.get("SSH_AUTH_SOCK"):
                    try:
                        self._agent_keys = list(paramiko.Agent().get_keys())
                    except paramiko.SSHException:
                        pass
            return self._agent_keys


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
                raise _Refused(f"jump host {ep.proxy_jump} could not reach "
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
                except _Refused as exc:
                    raise _Refused(f"jump host {hop}: {exc}") from None
                except (paramiko.SSHException, OSError) as exc:
                    raise _Refused(f"jump host {hop}: {exc}") from None
                self._jumps[chain] = jump
        assert jump is not None
        return jump

    def _hop_endpoint(self, host: HostTarget, hop: str) -> Endpoint:
        user, name, port = parse_jump(hop)
        options = self.configs.lookup(host.ssh_config_file, name)
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
                raise _Refused(f"SSH handshake with {where} failed: {exc or type(exc).__name__}"
                               ) from None
            self.known_hosts.verify(ep, transport.get_remote_server_key())
            self._authenticate(transport, ep)
            return transport
        except BaseException:
            transport.close()
            raise

    def _authenticate(self, transport: paramiko.Transport, ep: Endpoint) -> None:
        keys, notes = self.identities.candidates(ep)
        tried = []
        for name, key in keys:
            try:
                transport.auth_publickey(ep.user, key)
            except paramiko.AuthenticationException:
                tried.append(name)
                continue
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise _Refused(f"authentication with {ep.hostname}:{ep.port} broke off: {exc}"
                               ) from None
            if transport.is_authenticated():
                return
        what = ", ".join(tried) if tried else "no key at all"
        extra = f" ({'; '.join(notes)})" if notes else ""
        first = next((k for k in tried if not k.startswith("ssh-agent")), "KEY")
        raise _Refused(
            f"authentication as {ep.user!r} rejected by {ep.hostname}:{ep.port}: tried "
            f"{what}{extra}. Install your public key on the host (`ssh-copy-id -i "
            f"{shlex.quote(first)}.pub -p {ep.port} {ep.user}@{ep.hostname}`) or set "
            "`identity_file:` / `user:` for this host"
        )

    def close(self) -> None:
        with self._lock:
            jumps, self._jumps = list(self._jumps.values()), {}
        for jump in jumps:
            jump.transport.close()


def _base_type(algorithm: str) -> str:
    # RSA keys are filed as ssh-rsa whichever signature algorithm is negotiated.
    return "ssh-rsa" if algorithm.startswith("rsa-sha2-") else algorithm


def _tcp_connect(ep: Endpoint) -> socket.socket:
    where = f"{ep.hostname}:{ep.port}"
    try:
        sock = socket.create_connection((ep.hostname, ep.port), timeout=ep.timeout_s)
    except socket.gaierror as exc:
        raise _Refused(f"cannot resolve {ep.hostname!r} ({exc.strerror}): check the address "
                       "or the HostName of your ssh config") from None
    except ConnectionRefusedError:
        raise _Refused(f"connection refused by {where}: is sshd running there, and is the "
                       "port right (`port:` in the YAML)?") from None
    except TimeoutError:
        raise _Refused(f"no answer from {where} within {ep.timeout_s:g} s "
                       "(connect_timeout_s): host down or firewalled?") from None
    except OSError as exc:
        raise _Refused(f"cannot connect to {where}: {exc.strerror or exc}") from None
    # Small JSON lines both ways: Nagle would hold each one back (52 -> 10 ms auth).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    return sock


# ---------------------------------------------------------------- the agent


def agent_command(python: str, cache: str, host: str, run_dir: str, eof_grace_s: float) -> str:
    """The remote command: run the cached agent, or exit 98 when the cache lacks it.

    `exec`, so the agent replaces the remote shell. That shell still reads the
    user's rc file first (Debian's bash sources ~/.bashrc for any command sshd
    runs; a pyenv init there costs ~0.1 s of CPU per host): no client can
    avoid it, so the agent keeps its own start light instead (`python -S`).
    `"$HOME"` is the only part the remote shell expands; every other value is
    quoted. `run_dir` may start with `~/`: the agent expands it.
    """
    code = f'"$HOME"/{shlex.quote(cache)}'
    return (f"test -f {code}/launcher/agent.py || exit {EXIT_BUNDLE_MISSING}; "
            f"exec env PYTHONPATH={code} {shlex.quote(python)} -S -m launcher.agent "
            f"--host {shlex.quote(host)} --run-dir {shlex.quote(run_dir)} "
            f"--eof-grace {eof_grace_s:g}")


def upload_bundle(sftp: paramiko.SFTPClient, cache_root: str, version: str) -> None:
    """Put the bundle into `<cache_root>/<version>` (0700 dirs, 0600 files), atomically.

    Written into a staging directory and renamed, so a half-written bundle is
    never used, even when two launchers upload at once.
    """
    root = ""
    for part in cache_root.split("/"):
        root = f"{root}/{part}" if root else part
        try:
            sftp.stat(root)
        except FileNotFoundError:
            with contextlib.suppress(OSError):  # a racing launcher made it
                sftp.mkdir(root, 0o700)
    target = f"{cache_root}/{version}"
    staging = f"{cache_root}/.staging-{secrets.token_hex(6)}"
    sftp.mkdir(staging, 0o700)
    made = {staging}
    try:
        for relative, content in bundle_files():
            folder = staging
            for part in relative.split("/")[:-1]:
                folder = f"{folder}/{part}"
                if folder not in made:
                    sftp.mkdir(folder, 0o700)
                    made.add(folder)
            path = f"{staging}/{relative}"
            sftp.putfo(io.BytesIO(content), path, confirm=False)
            sftp.chmod(path, 0o600)
        try:
            sftp.rename(staging, target)
        except OSError:
            sftp.stat(f"{target}/launcher/agent.py")  # another launcher won: fine
            _remove_tree(sftp, staging)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove_tree(sftp, staging)
        raise


def _remove_tree(sftp: paramiko.SFTPClient, path: str) -> None:
    for entry in sftp.listdir_attr(path):
        child = f"{path}/{entry.filename}"
        if entry.st_mode is not None and (entry.st_mode & 0o170000) == 0o040000:
            _remove_tree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)


class _Session:
    """One host's connection, agent channel and stderr tail."""

    def __init__(self, host: HostTarget, ep: Endpoint, transport: paramiko.Transport) -> None:
        self.host = host
        self.ep = ep
        self.transport = transport
        self.channel: paramiko.Channel | None = None
        self.link: AgentLink | None = None
        self.stderr_tail: deque[str] = deque(maxlen=20)

    def exec_agent(self, command: str) -> None:
        self.channel = self.transport.open_session(timeout=self.ep.timeout_s)
        self.channel.exec_command(command)
        threading.Thread(target=self._drain_stderr, args=(self.channel,), daemon=True,
                         name=f"stderr-{self.host.name}").start()

    def _drain_stderr(self, channel: paramiko.Channel) -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            for raw in channel.makefile_stderr("rb"):
                self.stderr_tail.append(raw.decode("utf-8", "replace").rstrip())

    def exit_status(self, wait_s: float) -> int | None:
        channel = self.channel
        if channel is None:
            return None
        deadline = time.monotonic() + wait_s
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            if not self.transport.is_active():
                return None
            time.sleep(0.02)
        return channel.recv_exit_status() if channel.exit_status_ready() else None

    def diagnostics(self) -> str:
        code = self.exit_status(1.0)  # the pipe closed; the exit status follows
        if code == -1:
            # paramiko's "closed without an exit status": the sshd session died
            # or the connection dropped. paramiko closes the channels before it
            # marks the transport inactive, so give that a moment.
            code = None
            deadline = time.monotonic() + 1.0
            while self.transport.is_active() and time.monotonic() < deadline:
                time.sleep(0.02)
        tail = " | ".join(list(self.stderr_tail)[-3:])
        if code is None and not self.transport.is_active():
            return (f"SSH connection to {self.ep.hostname}:{self.ep.port} dropped"
                    + (f": {tail}" if tail else ""))
        if code is None:
            return tail or "the agent's SSH session ended without an exit status"
        return f"agent exited with {code}" + (f": {tail}" if tail else "")

    def close(self) -> None:
        self.transport.close()


class SSHTransport:
    """Start one agent per host over SSH; the supervisor sees only `AgentLink`s."""

    def __init__(self, *, eof_grace_s: float = 2.0, remote_cache: str = REMOTE_CACHE,
                 require_tensorflow: bool = True, max_parallel: int = MAX_PARALLEL,
                 connector: Connector | None = None) -> None:
        self._eof_grace_s = eof_grace_s
        self._remote_cache = remote_cache.strip("/")
        self._require_tf = require_tensorflow
        self._max_parallel = max_parallel
        self._connector = connector or Connector()
        self._sessions: list[_Session] = []
        self._lock = threading.Lock()

    def connect(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> dict[str, AgentLink]:
        links, problems = self.connect_each(hosts, run_dir, events)
        if problems:
            for link in links.values():
                link.close()
            self._close_sessions([s for s in self._sessions if s.host.name in links])
            raise TransportError(problems)
        return links

    def connect_each(
        self, hosts: Sequence[HostTarget], run_dir: str, events: queue.Queue[AgentMessage]
    ) -> tuple[dict[str, AgentLink], list[HostProblem]]:
        """Like `connect`, but keep the hosts that worked: (links, problems)."""
        links: dict[str, AgentLink] = {}
        problems: list[HostProblem] = []
        workers = max(1, min(self._max_parallel, len(hosts)))
        with ThreadPoolExecutor(workers, thread_name_prefix="ssh-connect") as pool:
            futures = [(h, pool.submit(self._start_host, h, run_dir, events)) for h in hosts]
            for host, future in futures:
                try:
                    links[host.name] = future.result()
                except HostProblem as problem:
                    problems.append(problem)
                except Exception as exc:  # a bug or an odd failure: still name the host
                    problems.append(HostProblem(host.name, f"{type(exc).__name__}: {exc}"))
        return links, problems

    def _start_host(self, host: HostTarget, run_dir: str,
                    events: queue.Queue[AgentMessage]) -> AgentLink:
        try:
            transport, ep = self._connector.open(host)
        except _Refused as exc:
            raise HostProblem(host.name, str(exc)) from None
        session = _Session(host, ep, transport)
        with self._lock:
            self._sessions.append(session)
        try:
            return self._start_agent(session, run_dir, events)
        except _Refused as exc:
            session.close()
            raise HostProblem(host.name, str(exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            session.close()
            raise HostProblem(host.name, f"SSH session on {ep.hostname}:{ep.port} failed: "
                              f"{exc or type(exc).__name__}") from None

    def _start_agent(self, session: _Session, run_dir: str,
                     events: queue.Queue[AgentMessage]) -> AgentLink:
        host = session.host
        where = where_of(session)
        version = bundle_id()
        cache = f"{self._remote_cache}/{version}"
        command = agent_command(host.python, cache, host.name,
                                host_run_dir(run_dir, "ssh", host.name), self._eof_grace_s)
        for attempt in range(2):
            session.exec_agent(command)
            assert session.channel is not None
            stdout = session.channel.makefile("rb")
            hello = self._read_hello(session, stdout)
            if hello is not None:
                break
            code = session.exit_status(5.0)
            if code == EXIT_BUNDLE_MISSING and attempt == 0:
                sftp = session.transport.open_sftp_client()
                try:
                    upload_bundle(sftp, self._remote_cache, version)
                finally:
                    sftp.close()
                continue
            raise _Refused(self._why_no_hello(session, code, where))
        else:  # pragma: no cover - the loop always breaks or raises
            raise _Refused("agent did not start")
        self._check_hello(hello, host, where)
        channel = session.channel
        channel.settimeout(None)
        def on_close() -> None:
            # The agent stops its tasks on EOF within its grace; then let the
            # connection go, so a lost host's SSH session does not linger.
            timer = threading.Timer(self._eof_grace_s + 3.0, session.close)
            timer.daemon = True
            timer.start()

        link = AgentLink(host.name, channel.makefile_stdin("wb"), stdout, events,
                         on_close=on_close, diagnostics=session.diagnostics)
        link.hello = hello
        link.hello_seen.set()
        session.link = link
        events.put(AgentMessage(host.name, hello))
        link.start_reading()
        return link

    def _read_hello(self, session: _Session, stdout) -> dict | None:
        """The agent's first line; None when the channel ends without one."""
        assert session.channel is not None
        session.channel.settimeout(HELLO_TIMEOUT_S)
        try:
            while True:
                raw = stdout.readline()
                if not raw:
                    return None
                try:
                    message = json.loads(raw)
                except ValueError:
                    session.stderr_tail.append(raw.decode("utf-8", "replace").rstrip())
                    continue  # e.g. a shell rc file that prints: skip it
                if isinstance(message, dict) and message.get("ev") == "hello":
                    return message
        except TimeoutError:
            raise _Refused(f"the agent on {where_of(session)} sent no hello within "
                           f"{HELLO_TIMEOUT_S:g} s") from None

    def _why_no_hello(self, session: _Session, code: int | None, where: str) -> str:
        python = session.host.python
        tail = " | ".join(list(session.stderr_tail)[-3:])
        if code == 127:
            return (f"python {python!r} not found on {where}: set `python:` for this host "
                    "to an interpreter that exists there")
        if code == 126:
            return f"python {python!r} is not executable on {where}: set `python:` for this host"
        if code is None:
            return f"the agent on {where} did not start: {session.diagnostics() or 'no answer'}"
        return (f"the agent on {where} exited with {code} before saying hello"
                + (f": {tail}" if tail else "") + f" (python {python!r})")

    def _check_hello(self, hello: dict, host: HostTarget, where: str) -> None:
        packages = hello.get("packages") or {}
        if self._require_tf and not packages.get("tensorflow"):
            raise _Refused(
                f"TensorFlow is not installed for python {host.python!r} on {where} "
                f"(Python {hello.get('python_version', '?')} at {hello.get('python', '?')}): "
                "install it there, or set `python:` for this host to an interpreter that has it"
            )

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
        self._close_sessions(sessions)
        self._connector.close()

    def _close_sessions(self, sessions: list[_Session]) -> None:
        # Agents stop their tasks once stdin closes (the caller closed the
        # links); give them the grace period to report before the connection goes.
        deadline = time.monotonic() + self._eof_grace_s + 5.0
        for session in sessions:
            silent = (session.link is not None
                      and time.monotonic() - session.link.last_seen > SILENT_AGENT_S)
            if session.channel is not None and session.transport.is_active() and not silent:
                session.exit_status(max(0.0, deadline - time.monotonic()))
            session.close()
        with self._lock:
            self._sessions = [s for s in self._sessions if s not in sessions]


def where_of(session: _Session) -> str:
    host = session.host
    return host.address if host.address == host.name else f"{host.name} ({host.address})"
