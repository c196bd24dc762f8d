"""The one transport factory: which transport a cluster file's `transport:` means.

A run and `check` both get their transport here, so they reach the hosts the
same way (`check` differs only where it must: it checks hosts that lack
TensorFlow instead of refusing them, and its agents keep their default lease).
Each transport module is imported only when chosen (paramiko for SSH).

Must not import: supervisor, cli.
"""

from __future__ import annotations

import logging
import os

from ..spec.config import ClusterConfig
from . import Transport


def make_transport(config: ClusterConfig, *, checking: bool = False) -> Transport:
    """The transport of `config.transport`. A run's agents hold a lease of the
    heartbeat timeout (they stop their tasks when the launcher falls silent);
    `checking`: for `mgpu-launch check`."""
    lease = {} if checking else {"lease_s": config.restart.heartbeat_timeout_s}
    if config.transport == "local":
        from .local import LocalTransport

        return LocalTransport(**lease)
    if config.transport == "slurm":  # one srun step per node instead of SSH
        from ..spec.allocation import read_allocation
        from .slurm import SlurmTransport

        job_id = read_allocation(os.environ).job_id
        if checking:
            return SlurmTransport(job_id, require_tensorflow=False, signal_when_gone=False)
        return SlurmTransport(job_id, **lease)
    from .ssh import SSHTransport

    return SSHTransport(require_tensorflow=not checking, **lease)


def quiet_paramiko_logs() -> None:
    """paramiko logs tracebacks of what the launcher reports itself in words
    (a dropped connection, an aborted handshake): a run says them once, as
    words (`-v` keeps paramiko's own)."""
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False
