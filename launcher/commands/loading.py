"""A command's cluster from its arguments: a cluster file, `--local N` or a
batch allocation's nodes (`--slurm`: one `--NAME` per batch system).

One place for the run command, `drill` and `check`: which of the three the
arguments name, the loaded config (with the allocation read for a transport
that runs in one, `transport: slurm`), and for the commands that run a
script, the script and its arguments after the cluster. Raises
`ArgumentError` for arguments that name no cluster or no script (each command
says it in its own words, exit 2), and lets `ConfigError` and
`AllocationError` through.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ..spec.allocation import (
    BatchSystem,
    allocation_config,
    system_of,
    systems,
    with_allocation,
)
from ..spec.config import LoadedConfig, load_config, local_config
from ..spec.plan import resolve_script
from ..spec.transports import traits


class ArgumentError(Exception):
    """The arguments name no cluster, or no script to run on it."""


def add_allocation_options(parser: argparse.ArgumentParser,
                           help_of: Callable[[BatchSystem], str] | None = None) -> None:
    """`--NAME` for each batch system (`--slurm`): `args.allocation` its name."""
    for system in systems():
        parser.add_argument(f"--{system.name}", dest="allocation", action="store_const",
                            const=system.name,
                            help=help_of(system) if help_of else system.option_help)
    parser.set_defaults(allocation=None)


def load_cluster(cluster: str | None, local: int | None,
                 allocation: str | None) -> LoadedConfig:
    """The config of N simulated hosts (`local`), of the nodes of the batch
    allocation this runs in (`allocation`: its system's name, `--slurm`) or of
    the cluster file; the allocation's nodes are read for a cluster file of
    `transport: slurm` too."""
    if local is not None:
        loaded = local_config(local)
    elif allocation:
        loaded = allocation_config(next(s for s in systems() if s.name == allocation))
    else:
        assert cluster is not None
        loaded = load_config(cluster)
    if traits(loaded.config.transport).allocation:
        loaded = with_allocation(loaded, system_of(loaded.config.transport).read(os.environ))
    return loaded


def cluster_and_script(rest: Sequence[str], local: int | None, allocation: str | None, *,
                       expected: str = "expected a cluster YAML and a training script",
                       check_script: Callable[[str], None] | None = None,
                       ) -> tuple[LoadedConfig, list[str]]:
    """`[CLUSTER.yaml] SCRIPT [ARGS...]` (after `--local N` or `--slurm`, no
    cluster file) to the loaded config and the command; on simulated hosts the
    script is found here (a missing one is an ArgumentError). `expected`: the
    words when a cluster file or script is missing; `check_script(script)`: the
    command's own check of a script given after `--local`/`--slurm`."""
    rest = list(rest)
    if rest and rest[0] == "--":
        rest = rest[1:]
    if local is not None and allocation:
        raise ArgumentError(f"--local and --{allocation} exclude each other")
    if local is not None and local < 1:
        raise ArgumentError("--local needs a number of hosts >= 1")
    if local is not None or allocation:
        if not rest:
            raise ArgumentError("no training script given")
        if check_script is not None:
            check_script(rest[0])
        loaded, command = load_cluster(None, local, allocation), rest
    elif len(rest) < 2:
        raise ArgumentError(expected)
    else:
        loaded, command = load_cluster(rest[0], None, None), rest[1:]
        if command[0] == "--":  # `CLUSTER.yaml -- SCRIPT`
            command = command[1:]
        if not command:
            raise ArgumentError(expected)
        if command[0].startswith("-"):
            raise ArgumentError(
                f"{command[0]} is not a training script: this command's options go before "
                f"the cluster file ({rest[0]}), the script's own arguments after the script")
    if traits(loaded.config.transport).simulated:
        command = list(resolve_script(command, Path.cwd()))
        if not Path(command[0]).exists():
            raise ArgumentError(f"training script not found: {command[0]}")
    return loaded, command
