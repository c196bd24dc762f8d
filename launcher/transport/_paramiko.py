"""paramiko, imported without `invoke`.

paramiko's config module imports `invoke` (~45 ms of CPU on every launcher
start) only to run `Match exec` commands of an ssh config, which mgpu-launch
does not support (README: "Not supported from the ssh config"). An ssh config
that uses it is refused with a clear message (`ssh_connect.SSHConfigs`).
"""

import sys

sys.modules.setdefault("invoke", None)  # type: ignore[arg-type]  # `import invoke` fails

import paramiko  # noqa: E402

__all__ = ["paramiko"]
