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

from ..spec.config import ClusterConfig
from ..spec.transports import traits
from . import Transport


def make_transport(config: ClusterConfig, *, checking: bool = False) -> Transport:
    """The transport of `config.transport`. A run's agents hold a lease of the
    heartbeat timeout (they stop their tasks when the launcher falls silent);
    `checking`: for `mgpu-launch check`."""
    lease = {} if checking else run_lease(config)
    module = importlib.import_module(f"{__package__}.{traits(config.transport).module}")
    transport: Transport = module.from_config(config, checking=checking, lease=lease)
    return transport


def run_lease(config: ClusterConfig) -> dict[str, float]:
    """A run's agents' lease, as `make_transport` hands it to the transport."""
    return {"lease_s": config.restart.heartbeat_timeout_s}


def quiet_paramiko_logs() -> None:
    """launcher/transport/_paramiko.py's (imported only where a command reaches SSH hosts)."""
    from ._paramiko import quiet_paramiko_logs as quiet

    quiet()
