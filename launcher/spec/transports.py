"""The transports a cluster file may name (`transport:`), declared once: each
one's name, the module that makes it, and what the rest of the launcher asks
of it. Nothing else compares a transport's name; a new transport is its module
under launcher/transport/ (with a `from_config`) plus a row of `TRANSPORTS`
(docs/design.md, "A new transport").

`TransportName` is a `StrEnum`, like launcher/strategy.py's `Strategy`: a
member equals the name the cluster file and `config.transport` hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class TransportName(StrEnum):
    SSH = "ssh"
    LOCAL = "local"
    SLURM = "slurm"


DEFAULT = TransportName.SSH


@dataclass(frozen=True)
class Traits:
    """What config, plan, the launch, `check`, the drill and the cli ask of a transport."""

    # launcher/transport/<module>.py, whose `from_config(config, checking=, lease=)` makes it.
    module: str = ""
    # Its hosts are processes on this machine: the script is found here, the
    # ports default to `auto` and are checked free here, the checkpoint
    # directory is claimed here, each agent's files live in the run directory.
    simulated: bool = False
    # Its hosts are the nodes of the batch allocation the launcher runs in: the
    # module under launcher/spec/ of its batch system ("slurm": spec/slurm.py's
    # SYSTEM; spec/allocation.py). The cluster file may list no host, a lost
    # host cannot be drilled, and a SIGTERM is the allocation ending.
    allocation: str | None = None
    # It reaches the hosts by SSH (paramiko): ~/.ssh/config's HostName is a TF
    # address, logins are timed by `check`, a host can be lost in a drill by
    # default, and several real hosts need a shared checkpoint directory and fixed ports.
    ssh: bool = False


TRANSPORTS: dict[TransportName, Traits] = {
    TransportName.SSH: Traits(module="ssh", ssh=True),
    TransportName.LOCAL: Traits(module="local", simulated=True),
    TransportName.SLURM: Traits(module="slurm", allocation="slurm"),
}

# The names, in the order the cluster file's errors list them.
NAMES: tuple[str, ...] = tuple(name.value for name in TRANSPORTS)

_UNKNOWN = Traits()  # a name the schema refuses: asks nothing


def traits(name: object) -> Traits:
    """What the transport `name` is (config.transport, or a raw value before validation)."""
    try:
        return TRANSPORTS[TransportName(name)]
    except (ValueError, TypeError):
        return _UNKNOWN
