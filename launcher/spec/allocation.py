"""A batch allocation as the cluster: the trait `allocation` of a transport
(launcher/spec/transports.py), for any batch system.

A transport whose hosts are the nodes of the allocation the launcher runs in
names its batch system's module under launcher/spec/ (`Traits.allocation`:
"slurm" is launcher/spec/slurm.py), whose `SYSTEM` is a `BatchSystem`: how
the allocation is read from the environment, whether it ended, why a SIGTERM
came, its ports. The rest is here, the same for every batch system: the
command-line option (`--slurm`: `--NAME` of each system), the config of
`--NAME` (every node, one worker each), and `with_allocation`, which turns a
config's hosts into the allocation's nodes: no `hosts:` means every node, one
worker each; an explicit list keeps its roles, spares and GPUs, and every
address must be a node of the allocation, or `NAME:N`, its N-th node counted
from 0. A new batch system (PBS, LSF) is its module here and a row of
`TRANSPORTS` with its transport (docs/design.md, "A new batch system").

Must not import: plan, transport, supervisor, cli.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .config import ClusterConfig, ConfigError, LoadedConfig, revalidate
from .transports import TRANSPORTS, TransportName, traits


class AllocationError(Exception):
    """Not inside a usable allocation; the message says what to do."""


@dataclass(frozen=True)
class Allocation:
    job_id: str
    nodes: tuple[str, ...]  # in the batch system's order
    gpus: tuple[int, ...]  # per node, when the allocation has GPUs


@dataclass(frozen=True)
class BatchSystem:
    """What the launcher asks of a batch system (one module's `SYSTEM`)."""

    name: str  # its `--NAME` option, and `address: NAME:N`
    title: str  # in words: "Slurm"
    read: Callable[[Mapping[str, str]], Allocation]  # raises AllocationError outside one
    ended: Callable[[str], bool]  # the job of this id is over (False: running, or unknown)
    why_stopped: Callable[[str], str]  # why a SIGTERM came, in words for the summary
    auto_port_base: Callable[[str], int]  # `ports.base: auto`, from the job id
    more_nodes: Callable[[int], str]  # how to ask it for N nodes, in words
    option_help: str  # `--NAME`'s help


def system_of(transport: object) -> BatchSystem:
    """The batch system of a transport whose hosts are an allocation's nodes."""
    module = traits(transport).allocation
    if not module:
        raise ValueError(f"transport {transport!r} runs in no batch allocation")
    return importlib.import_module(f"launcher.spec.{module}").SYSTEM


def transport_of(system: BatchSystem) -> TransportName:
    return next(name for name, row in TRANSPORTS.items() if row.allocation
                and system_of(name) is system)


def systems() -> list[BatchSystem]:
    """Every batch system a transport runs in, in the table's order."""
    return [system_of(name) for name, row in TRANSPORTS.items() if row.allocation]


def allocation_config(system: BatchSystem) -> LoadedConfig:
    """The config behind `mgpu-launch --NAME`: every node of the allocation, one worker each."""
    config = ClusterConfig.model_validate({"name": system.name,
                                           "transport": transport_of(system).value,
                                           "hosts": [], "ports": {"base": "auto"}})
    return LoadedConfig(config=config, source=None, base_dir=Path.cwd())


def with_allocation(loaded: LoadedConfig, allocation: Allocation,
                    python: str = sys.executable) -> LoadedConfig:
    """`loaded` with its hosts taken from the allocation (see the module doc).

    Also: `python` defaults to this interpreter (a batch cluster's nodes share
    the software this process sees, and the job step passes our environment
    on), and `ports.base: auto` becomes a base picked from the job id. Raises
    ConfigError (exit 2) for an address that is not a node of the allocation.
    """
    config = loaded.config
    system = system_of(config.transport)
    data = config.model_dump(mode="json", exclude_unset=True)
    nodes = list(allocation.nodes)
    if not config.hosts:
        data["hosts"] = [{"address": node, "gpus": list(allocation.gpus)} for node in nodes]
    else:
        problems = _placed(config, data["hosts"], allocation, system)
        if problems:
            raise ConfigError(str(loaded.source or f"--{system.name}"), problems)
        for host, spec in zip(data["hosts"], config.hosts, strict=True):
            if "gpus" not in spec.model_fields_set:
                host["gpus"] = list(allocation.gpus)
    if config.ports.base == "auto":
        data["ports"] = {**data.get("ports", {}),
                         "base": system.auto_port_base(allocation.job_id)}
    if config.python is None:
        data["python"] = python
    return revalidate(loaded, data)


def _placed(config: ClusterConfig, entries: list[dict], allocation: Allocation,
            system: BatchSystem) -> list[str]:
    """Each host's address made a node of the allocation (`NAME:N` its N-th);
    the problems of those that are none."""
    problems, nodes, prefix = [], list(allocation.nodes), f"{system.name}:"
    job = f"{system.title} job {allocation.job_id}"
    for i, (host, entry) in enumerate(zip(config.hosts, entries, strict=True)):
        position = host.address.removeprefix(prefix)
        if host.address.startswith(prefix) and position.isdigit():
            if int(position) < len(nodes):
                entry["address"] = nodes[int(position)]
            else:
                problems.append(
                    f"hosts[{i}].address: {host.address!r}, but {job} has {len(nodes)} "
                    f"node(s): allocate at least {len(config.hosts)} "
                    f"({system.more_nodes(len(config.hosts))})")
        elif host.address not in nodes:
            problems.append(
                f"hosts[{i}].address: {host.address!r} is not a node of {job} (its nodes: "
                f"{_short(nodes)}); list only nodes of the allocation, or leave `hosts:` out "
                "to use all of them")
    return problems


def _short(nodes: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(nodes[:limit])
    return shown + (f", ... ({len(nodes)} in all)" if len(nodes) > limit else "")
