"""Real hosts over SSH (paramiko): one agent per host on an exec channel.

Owns: putting the agent bundle into a per-version cache on the host
(transport/sshbundle.py), starting the agent there (`exec`, `python -S`),
and turning each host's connection into an `AgentLink`. Every host is handled at once in a bounded
thread pool; every host that fails is reported, one `HostProblem` each.
How a connection is opened (ssh config, host keys, keys) is `ssh_connect`'s.

Security: every value reaching the remote shell is shlex-quoted; TF_CONFIG
travels on the agent's stdin, never on a command line; the bundle is 0700/0600.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..spec.target import HostTarget, host_run_dir
from ..spec.transports import TransportName
from . import HostProblem, TransportError
from ._paramiko import paramiko

# The lease matters most here: behind a partition no EOF ever reaches an
# agent, and sshd may keep the session for hours.
from .child import DEFAULT_LEASE_S
from .link import AgentLink, AgentMessage
from .shipping import AGENT_MAIN, bundle_id
from .ssh_connect import Connector
from .ssh_endpoint import Endpoint, Refused
from .sshbundle import EXIT_BUNDLE_MISSING, EXIT_UNSAFE_CACHE, agent_command, upload_bundle

if TYPE_CHECKING:
    from ..spec.config import ClusterConfig

# The cluster file's `ssh.hello_timeout_s` (its default there too): a cold
# Python start on a loaded host; no TensorFlow import involved.
HELLO_TIMEOUT_S = 30.0

MAX_PARALLEL = 64  # threads mostly wait on the network; bounded so 500 hosts stay sane
# An agent heartbeats every second: one silent this long is on a dead host or
# behind a cut link, and waiting for its exit status at close would be in vain.
SILENT_AGENT_S = 5.0
REMOTE_CACHE = ".cache/mgpu-launch/code"  # relative to the remote home directory


# ---------------------------------------------------------------- the agent


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
        # status_event: set by paramiko with the exit status, or when the channel
        # closes; waited on, not polled, so the launcher's end follows the last
        # agent's exit at once (all 32 are waited on in turn at the end).
        while not channel.exit_status_ready() and time.monotonic() < deadline:
            if not self.transport.is_active():
                return None
            channel.status_event.wait(min(0.02, max(0.0, deadline - time.monotonic())))
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


def from_config(config: ClusterConfig | None, *, checking: bool,
                lease: dict[str, float]) -> SSHTransport:
    """`transport: ssh` (transport/factory.py); `check` also reaches hosts without TensorFlow."""
    hello = {} if config is None else {"hello_timeout_s": config.ssh.hello_timeout_s}
    return SSHTransport(require_tensorflow=not checking, **hello, **lease)


class SSHTransport:
    """Start one agent per host over SSH; the supervisor sees only `AgentLink`s."""

    def __init__(self, *, eof_grace_s: float = 2.0, remote_cache: str = REMOTE_CACHE,
                 require_tensorflow: bool = True, max_parallel: int = MAX_PARALLEL,
                 connector: Connector | None = None,
                 lease_s: float = DEFAULT_LEASE_S,
                 hello_timeout_s: float = HELLO_TIMEOUT_S) -> None:
        self._hello_timeout_s = hello_timeout_s
        self._eof_grace_s = eof_grace_s
        self._lease_s = lease_s
        self._remote_cache = remote_cache.strip("/")
        self._require_tf = require_tensorflow
        self._max_parallel = max_parallel
        self._connector = connector or Connector()
        self._sessions: list[_Session] = []
        self._lock = threading.Lock()
        self._closed = False
        # Called with each host's link as soon as its hello is in, while other
        # hosts may still be starting (job/run/reach.py: the firewall rules go then).
        self.on_link: Callable[[AgentLink], None] | None = None

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
        # Daemon threads, not a ThreadPoolExecutor: the interpreter joins an
        # executor's workers at exit, so Ctrl-C would wait for a hung host.
        gate = threading.Semaphore(max(1, min(self._max_parallel, len(hosts))))
        results: queue.Queue[tuple[str, AgentLink | BaseException]] = queue.Queue()

        def start(host: HostTarget) -> None:
            with gate:
                try:
                    results.put((host.name, self._start_host(host, run_dir, events)))
                except BaseException as exc:  # noqa: BLE001 - reported below, per host
                    results.put((host.name, exc))

        for host in hosts:
            threading.Thread(target=start, args=(host,), daemon=True,
                             name=f"ssh-connect-{host.name}").start()
        outcomes: dict[str, AgentLink | BaseException] = {}
        try:
            while len(outcomes) < len(hosts):
                name, outcome = results.get()
                outcomes[name] = outcome
        except BaseException:  # Ctrl-C: end the handshakes still going, do not wait
            self.abort()
            raise
        links: dict[str, AgentLink] = {}
        problems: list[HostProblem] = []
        for host in hosts:  # in the YAML's order
            outcome = outcomes[host.name]
            if isinstance(outcome, AgentLink):
                links[host.name] = outcome
            elif isinstance(outcome, HostProblem):
                problems.append(outcome)
            else:  # a bug or an odd failure: still name the host
                problems.append(HostProblem(host.name, f"{type(outcome).__name__}: {outcome}"))
        return links, problems

    def _start_host(self, host: HostTarget, run_dir: str,
                    events: queue.Queue[AgentMessage]) -> AgentLink:
        session, stdout, hello = self._reach_agent(host, run_dir)
        return self._link_agent(session, stdout, hello, events)

    def _reach_agent(self, host: HostTarget, run_dir: str) -> tuple[_Session, Any, dict]:
        """`host`'s agent for the run in `run_dir`, started: its session, its
        stdout and its hello (checked); HostProblem naming the host else."""
        try:
            transport, ep = self._connector.open(host)
        except Refused as exc:
            raise HostProblem(host.name, str(exc)) from None
        session = _Session(host, ep, transport)
        with self._lock:
            if self._closed:  # e.g. an abandoned reconnection that got through late
                session.close()
                raise HostProblem(host.name, "the launcher is stopping")
            self._sessions.append(session)
        try:
            stdout, hello = self._start_agent(session, run_dir)
            return session, stdout, hello
        except Refused as exc:
            session.close()
            raise HostProblem(host.name, str(exc)) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            session.close()
            raise HostProblem(host.name, f"SSH session on {session.ep.hostname}:"
                              f"{session.ep.port} failed: {exc or type(exc).__name__}") from None

    def _start_agent(self, session: _Session, run_dir: str) -> tuple[Any, dict]:
        host = session.host
        where = where_of(session)
        version = bundle_id()
        cache = f"{self._remote_cache}/{version}"
        files = host_run_dir(run_dir, TransportName.SSH, host.name)
        command = agent_command(host.python, cache, host.name, files, self._eof_grace_s,
                                self._lease_s)
        sftp_home = None
        for attempt in range(2):
            session.exec_agent(command)
            assert session.channel is not None
            stdout = session.channel.makefile("rb")
            hello = self._read_hello(session, stdout)
            if hello is not None:
                break
            code = session.exit_status(5.0)
            if code == EXIT_BUNDLE_MISSING and attempt == 0:
                sftp_home = self._ensure_bundle(session, version)
                # From now on the bundle's absolute path: the SFTP session's home
                # and the shell's $HOME may differ (an sshd that sets HOME, a
                # login script that moves it); the bundle is where SFTP put it.
                command = agent_command(host.python, cache, host.name, files,
                                        self._eof_grace_s, self._lease_s, home=sftp_home)
                continue
            raise Refused(self._why_no_hello(session, code, where, sftp_home))
        else:  # pragma: no cover - the loop always breaks or raises
            raise Refused("agent did not start")
        self._check_hello(hello, host, where)
        return stdout, hello

    def _link_agent(self, session: _Session, stdout, hello: dict,
                    events: queue.Queue[AgentMessage]) -> AgentLink:
        host = session.host
        channel = session.channel
        assert channel is not None
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
        if self.on_link is not None:
            self.on_link(link)
        return link

    def _read_hello(self, session: _Session, stdout) -> dict | None:
        """The agent's first line; None when the channel ends without one."""
        assert session.channel is not None
        session.channel.settimeout(self._hello_timeout_s)
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
            raise Refused(f"the agent on {where_of(session)} sent no hello within "
                          f"{self._hello_timeout_s:g} s (ssh.hello_timeout_s)") from None

    def _ensure_bundle(self, session: _Session, version: str) -> str:
        """Upload the bundle unless the SFTP session's home has it; that home."""
        sftp = session.transport.open_sftp_client()
        try:
            home = sftp.normalize(".")
            try:
                sftp.stat(f"{self._remote_cache}/{version}/{AGENT_MAIN}")
            except FileNotFoundError:
                upload_bundle(sftp, self._remote_cache, version)
            return home
        finally:
            sftp.close()

    def _why_no_hello(self, session: _Session, code: int | None, where: str,
                      sftp_home: str | None = None) -> str:
        python = session.host.python
        tail = " | ".join(list(session.stderr_tail)[-3:])
        if code == EXIT_BUNDLE_MISSING:
            return (f"the agent's code, uploaded over SFTP to {sftp_home}/{self._remote_cache} "
                    f"on {where}, is not found there by the remote shell ({tail}): the SFTP "
                    "session and the shell see different files (a chroot'ed or "
                    "ForceCommand'ed sftp?); make both reach the same home")
        if code == EXIT_UNSAFE_CACHE:
            return (f"the code cache on {where} could have been written by someone else, so "
                    f"its code is not run ({tail}): make it yours alone (`chmod -R go-w`, "
                    f"or remove ~/{self._remote_cache} there and launch again)")
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
            raise Refused(
                f"TensorFlow is not installed for python {host.python!r} on {where} "
                f"(Python {hello.get('python_version', '?')} at {hello.get('python', '?')}): "
                "install it there, or set `python:` for this host to an interpreter that has it"
            )

    def time_command(self, host: str, command: str = "true",
                     timeout: float = 30.0) -> float | None:
        """Seconds one command takes on `host` over its open connection, the
        login shell's start included (None when it failed). `check` reports it:
        the shell's rc files run before every command sshd starts."""
        with self._lock:
            session = next((s for s in self._sessions if s.host.name == host), None)
        if session is None or not session.transport.is_active():
            return None
        started = time.monotonic()
        try:
            channel = session.transport.open_session(timeout=timeout)
            try:
                channel.settimeout(timeout)
                channel.exec_command(command)
                if not channel.status_event.wait(timeout):  # set with the exit status
                    return None
                return time.monotonic() - started if channel.recv_exit_status() == 0 else None
            finally:
                channel.close()
        except (paramiko.SSHException, OSError, EOFError):
            return None

    def abort(self) -> None:
        """Stop at once: end handshakes in flight, drop sessions without waiting."""
        self._connector.abort()
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for session in sessions:
            session.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions, self._sessions = self._sessions, []
        self._close_sessions(sessions)
        self._connector.close()

    def _close_sessions(self, sessions: list[_Session]) -> None:
        # Agents stop their tasks once stdin closes (the caller closed the
        # links); give them the grace period to report before the connection goes.
        deadline = time.monotonic() + self._eof_grace_s + 5.0
        for session in sessions:
            # An agent without a link never had its stdin closed: nothing to wait for.
            waits = (session.link is not None
                     and time.monotonic() - session.link.last_seen <= SILENT_AGENT_S)
            if session.channel is not None and session.transport.is_active() and waits:
                session.exit_status(max(0.0, deadline - time.monotonic()))
            session.close()
        with self._lock:
            self._sessions = [s for s in self._sessions if s not in sessions]


def where_of(session: _Session) -> str:
    host = session.host
    return host.address if host.address == host.name else f"{host.name} ({host.address})"
