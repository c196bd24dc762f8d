"""Who we are to a host: public key authentication.

Owns: the identity files (parsed once) and ssh-agent (one connection per
handshake: see AgentSession), the order keys are tried in, and the words for
a failure. An agent that fails is named as such (SSH_AUTH_SOCK), never passed
off as a key the host rejected.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import threading

from ._paramiko import paramiko
from .ssh_endpoint import Endpoint, Refused
from .ssh_hostkeys import fingerprint

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


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
    `authenticate` reports the failure in words instead.
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


def authenticate(transport: paramiko.Transport, ep: Endpoint, identities: Identities) -> None:
    """Authenticate `transport` as `ep.user`, or raise Refused saying what was tried."""
    agent = AgentSession()  # this handshake's own: see AgentSession
    try:
        _try_keys(transport, ep, identities, agent)
    finally:
        agent.close()


def _try_keys(transport: paramiko.Transport, ep: Endpoint, identities: Identities,
              agent: AgentSession) -> None:
    keys, notes = identities.candidates(ep, agent)
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
