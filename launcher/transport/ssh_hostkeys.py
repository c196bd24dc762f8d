"""Host keys: is this the host we mean? (known_hosts and the host_key_policy)

Owns: verifying a host's key against its known_hosts file, recording a new
one under `accept-new`, and the words for a refusal (the fingerprints, the
`ssh-keyscan`/`ssh-keygen -R` to run). A host key is never accepted silently
(no AutoAddPolicy): `strict` refuses unknown keys, `accept-new` records them,
a changed key is refused under every policy.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shlex
import threading

from ._paramiko import paramiko
from .ssh_endpoint import Endpoint, Refused


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
