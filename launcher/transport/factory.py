"""The one transport factory: which transport a cluster file's `transport:` means.

A run and `check` both get their transport here, so they reach the hosts the
same way (`check` differs only where it must: it checks hosts that lack
TensorFlow instead of refusing them, and its agents keep their default lease).
Each transport module is imported only when chosen (paramiko for SSH): the
row of launcher/spec/transports.py names it, and its `from_config` makes it.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import importlib
import logging

from ..spec.config import ClusterConfig
from ..spec.transports import traits
from . import Transport


def make_transport(config: ClusterConfig, *, checking: bool = False) -> Transport:
    """The transport of `config.transport`. A run's agents hold a lease of the
    heartbeat timeout (they stop their tasks when the launcher falls silent);
    `checking`: for `mgpu-launch check`."""
    lease: dict[str, float] = {} if checking else {"lease_s": config.restart.heartbeat_timeout_s}
    module = importlib.import_module(f"{__package__}.{traits(config.transport).module}")
    transport: Transport = module.from_config(config, checking=checking, lease=lease)
    return transport


def quiet_paramiko_logs() -> None:
    """paramiko logs tracebacks of what the launcher reports itself in words
    (a dropped connection, an aborted handshake): a run says them once, as
    words (`-v` keeps paramiko's own)."""
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
