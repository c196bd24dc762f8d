"""paramiko, imported without `invoke`.

paramiko's config module imports `invoke` (~45 ms of CPU on every launcher
start) only to run `Match exec` commands of an ssh config, which mgpu-launch
does not support (docs/ssh.md). An ssh config
that uses it is refused with a clear message (`ssh_endpoint.SSHConfigs`).
"""

import logging
import sys

_blocked = "invoke" not in sys.modules
if _blocked:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` fails

import paramiko  # noqa: E402

if _blocked:  # paramiko has seen what it needed; the rest of the process may import it
    del sys.modules["invoke"]

__all__ = ["paramiko", "quiet_paramiko_logs"]


def quiet_paramiko_logs() -> None:
    """paramiko logs tracebacks of what the launcher reports itself in words
    (a dropped connection, an aborted handshake): a run says them once, as
    words (`-v` keeps paramiko's own)."""
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
