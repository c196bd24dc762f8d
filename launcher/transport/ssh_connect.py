"""Opening SSH connections (paramiko): `Connector.open` returns an
authenticated transport or raises `Refused` with the whole reason.

Owns: the connection itself (TCP with its options, the handshake, keepalives),
jump hosts (one shared connection per hop chain, a bounded number of
handshakes through each), and stopping every handshake at once on Ctrl-C. Its
parts: where a host is and who we are to it (launcher.transport.ssh_endpoint),
whether its key is known (launcher.transport.ssh_hostkeys), which keys
authenticate us (launcher.transport.ssh_auth).

Must not import: supervisor, cli.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import socket
import threading
from dataclasses import dataclass, field

from ..spec.target import HostTarget
from ._paramiko import paramiko
from .ssh_auth import Identities, authenticate
from .ssh_endpoint import Endpoint, Refused, SSHConfigs, merge_endpoint, parse_jump
from .ssh_hostkeys import KnownHosts

# Channel opens + handshakes at once through one jump host: a bastion's sshd
# drops connections past its MaxStartups (10 by default), and we stay well under.
JUMP_CONCURRENCY = 8
KEEPALIVE_S = 5  # keeps NAT/firewall state alive and surfaces dead peers to TCP
# Offered first: AES-GCM authenticates as it encrypts, where paramiko's own first
# choice, aes128-ctr, pays an HMAC-SHA2-256 over every byte besides. Both ends
# spend ~40 % less CPU on a bulk stream (the memory tier's peer copies go
# through the launcher: 200 MiB each way cost 1.9 s of CPU in paramiko and the
# sshd with aes128-ctr, 1.2 s with aes128-gcm; bench/sshcipher.py). OpenSSH offers
# both; a server that offers no GCM gets the rest of paramiko's list, in its order.
AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


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
            options = transport.get_security_options()
            options.ciphers = _aead_first(options.ciphers)
            known = self.known_hosts.known_types(ep)
            if known:
                # Ask for the key type we already hold, as OpenSSH does, so a
                # host with several keys is checked against the one on file.
                preferred = [t for t in options.key_types if _base_type(t) in known]
                rest = [t for t in options.key_types if t not in preferred]
                options.key_types = preferred + rest
            try:
                transport.start_client(timeout=ep.timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise Refused(f"SSH handshake with {where} failed: {exc or type(exc).__name__}"
                              ) from None
            self.known_hosts.verify(ep, transport.get_remote_server_key())
            authenticate(transport, ep, self.identities)
            if self._aborted:
                raise Refused("the launcher is stopping")
            return transport
        except BaseException:
            transport.close()
            raise
        finally:
            with self._lock:
                self._handshaking.pop(transport, None)

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


def _aead_first(ciphers: tuple[str, ...]) -> tuple[str, ...]:
    """paramiko's ciphers, the AEAD ones it has first (AEAD_CIPHERS)."""
    first = tuple(c for c in AEAD_CIPHERS if c in ciphers)
    return first + tuple(c for c in ciphers if c not in first)


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
