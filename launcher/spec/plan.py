"""The plan: which task runs where, on which port, with which environment.

Owns: `build_plan(loaded_config, ...) -> Plan`, a pure function returning frozen
dataclasses. Given the same inputs it returns the same plan; it touches no
file, socket or environment variable. `--dry-run` prints exactly this. The
environment the tasks share is launcher.spec.taskenv's.

Must not import: transport, supervisor, cli.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..fwrules import Seal, allowed, seal_for
from ..strategy import COLLECTIVE, Strategy
from . import transports
from .addresses import TFAddress, choose
from .config import ClusterConfig, LoadedConfig, effective_roles
from .hosts import HostSpec
from .target import HostTarget, host_run_dir
from .taskenv import keras_distribution_env, shared_env

# Order of roles in TF_CONFIG and in the task list: the chief first.
ROLE_ORDER = ("chief", "worker", "ps", "evaluator")
# Roles that belong to TF_CONFIG's `cluster`; the evaluator stays outside it,
# as TensorFlow expects for sidecar evaluation.
CLUSTER_ROLES = ("chief", "worker", "ps")


# ParameterServerStrategy's workers and ps only serve: the launcher starts a
# TensorFlow server for them; the chief (coordinator) runs the script.
SERVER_COMMAND = ("-m", "launcher.runtime.server")

def _lifetime(strategy: str, role: str) -> str:
    """`service` tasks never exit by themselves (TF servers, TF1 ps that join()):
    the launcher stops them once every `job` task has finished."""
    if strategy == Strategy.PARAMETER_SERVER and role in ("worker", "ps"):
        return "service"
    if strategy == Strategy.LEGACY_SERVER and role == "ps":
        return "service"
    if role == "evaluator":
        # A sidecar evaluator waits for new checkpoints for ever: it is stopped
        # with the servers once training is over (or may finish by itself).
        return "service"
    return "job"


class PlanError(Exception):
    """The config is valid YAML but cannot be turned into a runnable plan."""


def task_label(host: str, name: str) -> str:
    """`host0/worker0`: a task as output prefixes and summaries show it."""
    return f"{host}/{name}"


@dataclass(frozen=True)
class Task:
    """One process of the job: a role and index on a host."""

    host: str  # HostTarget.name
    role: str
    index: int
    address: str
    port: int | None  # None for the evaluator, which serves no port
    python: str
    cwd: str
    command: tuple[str, ...]  # script and its arguments, or SERVER_COMMAND
    lifetime: str  # "job": must exit 0 by itself; "service": runs until the launcher stops it
    env: Mapping[str, str] = field(hash=False)
    tf_config: Mapping[str, Any] = field(hash=False)
    # Which rule chose `address` (launcher/spec/addresses.py): tf_address,
    # network_interface, ssh_config or address.
    address_rule: str = "address"

    @property
    def name(self) -> str:
        """`worker0`, `chief0`, `ps1`: unique within a job."""
        return f"{self.role}{self.index}"

    @property
    def label(self) -> str:
        """`host0/worker0`: how the task is shown in output."""
        return task_label(self.host, self.name)

    def tf_config_json(self) -> str:
        return json.dumps(plain(self.tf_config), sort_keys=True)

    @property
    def argv(self) -> tuple[str, ...]:
        """What the agent executes (no shell involved)."""
        if self.command == SERVER_COMMAND:
            return (self.python, *SERVER_COMMAND)
        return (self.python, "-m", "launcher.bootstrap", *self.command)

    def shell_preview(self) -> str:
        """`argv` as one line, for humans."""
        return shlex.join(self.argv)


@dataclass(frozen=True)
class Plan:
    name: str
    strategy: str
    transport: str
    generation: int
    run_dir: str
    checkpoint_dir: str
    hosts: tuple[HostTarget, ...]
    tasks: tuple[Task, ...]
    grace_s: float
    # Each host's TF_CONFIG address and the rule that chose it.
    addresses: Mapping[str, TFAddress] = field(default_factory=dict, hash=False)
    # Each host's firewall rules for the job's ports (none: security.tf_ports open).
    firewall: Mapping[str, Seal] = field(default_factory=dict, hash=False)
    # The launcher picks the ports (`ports.base: auto`, or simulated hosts, whose
    # busy fixed ports a restart trades: job/run/reach.py): a restart takes fresh ones.
    ports_chosen: bool = False

    @property
    def unresolved(self) -> tuple[str, ...]:
        """Hosts whose address waits for their agent's hello (network_interface)."""
        return tuple(name for name, tf in self.addresses.items() if tf.address is None)

    def with_task_env(self, env: Mapping[str, str]) -> Plan:
        """This plan with `env` added to every task's environment."""
        return replace(self, tasks=tuple(replace(task, env={**task.env, **env})
                                         for task in self.tasks))


def plain(value: Any) -> Any:
    """Frozen mappings and tuples as plain dicts and lists (for JSON)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value


def host_targets(config: ClusterConfig, default_python: str,
                 base_dir: Path | None = None) -> tuple[HostTarget, ...]:
    """How to reach each host. Relative key, known_hosts and ssh config paths
    resolve against `base_dir` (the YAML's folder); `~` is left for the
    launcher's user to expand, as ssh does."""
    return tuple(_host_target(config, h, default_python, base_dir) for h in config.hosts)


def _host_target(config: ClusterConfig, host: HostSpec, default_python: str,
                 base_dir: Path | None) -> HostTarget:
    ssh = config.ssh

    def pick(own: Any, shared: Any) -> Any:
        return shared if own is None else own

    def path(own: str | None, shared: str | None) -> str | None:
        value = pick(own, shared)
        if value is None or base_dir is None or value.startswith("~") or Path(value).is_absolute():
            return value
        return str((base_dir / value).resolve())

    return HostTarget(
        name=host.name or host.address,
        address=host.address,
        python=host.python or config.python or default_python,
        gpus=tuple(host.gpus),
        ssh_user=pick(host.user, ssh.user),
        ssh_port=pick(host.port, ssh.port),
        identity_file=path(host.identity_file, ssh.identity_file),
        known_hosts=path(host.known_hosts, ssh.known_hosts),
        host_key_policy=pick(host.host_key_policy, ssh.host_key_policy),
        ssh_config_file=path(host.config_file, ssh.config_file),
        connect_timeout_s=pick(host.connect_timeout_s, ssh.connect_timeout_s),
    )


def default_active_hosts(config: ClusterConfig) -> list[str]:
    """Every host but the spares, by name."""
    return [h.name or h.address for h in config.hosts if not h.spare]


def ports_needed(config: ClusterConfig, active_hosts: Sequence[str] | None = None) -> int:
    """How many ports a plan of these hosts uses (one per chief, worker and ps)."""
    active = set(default_active_hosts(config) if active_hosts is None else active_hosts)
    return sum(count for h in config.hosts if (h.name or h.address) in active
               for role, count in effective_roles(config, h).items() if role in CLUSTER_ROLES)


def default_checkpoint_dir(loaded: LoadedConfig) -> str:
    configured = loaded.resolve_path(loaded.config.checkpoint.dir)
    if configured is not None:
        return str(configured)
    # Stable across runs of the same config, so a new launch resumes.
    return str((loaded.base_dir / "checkpoints" / loaded.config.name).resolve())


def build_plan(
    loaded: LoadedConfig,
    command: Sequence[str],
    *,
    run_dir: str,
    ports: Sequence[int] | None = None,
    generation: int = 0, default_python: str = "python3",
    launch_cwd: str = "/",
    active_hosts: Sequence[str] | None = None,
    addresses: Mapping[str, TFAddress] | None = None,
    run_id: str = "",
) -> Plan:
    """Compute every task of the job.

    `ports` are the ports to give the tasks that serve one, in task order; by
    default `ports.base`, `ports.base + 1`, ... Ports are unique across the
    whole job (not per host): TensorFlow's gRPC server binds every interface,
    so simulated hosts sharing one machine would otherwise collide.

    `addresses`: each host's TF_CONFIG address (launcher.transport.resolve.
    tf_addresses, which reads the ssh config and the agents' hellos); a host
    missing there gets what the cluster file alone says (launcher.spec.addresses).
    An address not known yet (a network interface's, before the hello) appears
    as `<address of IF on HOST>`: such a plan is for --dry-run only. `run_id`:
    this run's, the same in every generation (MGPU_RUN_ID).
    """
    config = loaded.config
    if not command:
        raise PlanError("no training script given")
    targets = _active_targets(loaded, default_python, active_hosts)
    tf_of = _tf_addresses(config, targets, addresses or {})
    slots = _slots(config, targets)
    _check_roles(config.strategy, [slot.role for slot in slots])
    port_of = _ports(config, [s for s in slots if s.role in CLUSTER_ROLES], ports)
    cluster = _cluster(slots, tf_of, port_of)
    checkpoint_dir = default_checkpoint_dir(loaded)
    common_env = shared_env(config, checkpoint_dir, generation,
                            num_workers=len(cluster.get("chief", [])) +
                            len(cluster.get("worker", [])), run_id=run_id)
    if "MGPU_MEMORY_COPIES" in common_env and len(targets) < 2:
        common_env["MGPU_MEMORY_PEER"] = "0"  # no other host for a second copy (agent/peercopy.py)
    workdir = str(loaded.resolve_path(config.workdir) or launch_cwd)
    frozen = _freeze(cluster)  # once: every task's TF_CONFIG shares it (10,000 hosts)
    tasks = [_task(config, slot, tf_of[slot.target.name], cluster, frozen, port_of,
                   common_env, command, run_dir, workdir)
             for slot in slots]
    return Plan(
        name=config.name, strategy=config.strategy, transport=config.transport,
        generation=generation,
        run_dir=run_dir,
        checkpoint_dir=checkpoint_dir,
        hosts=tuple(targets),
        tasks=tuple(tasks),
        grace_s=config.restart.grace_s,
        addresses=MappingProxyType(tf_of),
        firewall=MappingProxyType(_seals(config, loaded, default_python, run_dir, tasks,
                                         {**(addresses or {}), **tf_of})),
        ports_chosen=config.ports.base == "auto" or transports.traits(config.transport).simulated,
    )


def _active_targets(loaded: LoadedConfig, default_python: str,
                    active_hosts: Sequence[str] | None) -> list[HostTarget]:
    """The hosts of this generation (default: every host but the spares), in file order."""
    config = loaded.config
    active = default_active_hosts(config) if active_hosts is None else list(active_hosts)
    chosen = set(active)  # a set: 10,000 hosts in a list would be quadratic
    targets = [h for h in host_targets(config, default_python, loaded.base_dir)
               if h.name in chosen]
    if not targets:
        raise PlanError("no host left to run on")
    return targets


def _tf_addresses(config: ClusterConfig, targets: Sequence[HostTarget],
                  known: Mapping[str, TFAddress]) -> dict[str, TFAddress]:
    """Each host's TF_CONFIG address: `known` (see build_plan), else what the
    cluster file alone says."""
    specs = {(h.name or h.address): h for h in config.hosts}
    return {t.name: known.get(t.name) or choose(config, specs[t.name]) for t in targets}


def _cluster(slots: Sequence[_Slot], tf_of: Mapping[str, TFAddress],
             port_of: Mapping[tuple[str, int], int]) -> dict[str, list[str]]:
    """TF_CONFIG's `cluster`: each role's `address:port`s in task order (no evaluator)."""
    cluster: dict[str, list[str]] = {}
    for slot in slots:
        if slot.role in CLUSTER_ROLES:
            cluster.setdefault(slot.role, []).append(
                f"{tf_of[slot.target.name].shown}:{port_of[(slot.role, slot.index)]}")
    return cluster


def _seals(config: ClusterConfig, loaded: LoadedConfig, default_python: str, run_dir: str,
           tasks: Sequence[Task], tf_of: Mapping[str, TFAddress]) -> dict[str, Seal]:
    """Each host's firewall rules: its tasks' ports admit every host of the
    cluster file (spares too: they may join later), by SSH and TF address; and
    every task's port, at each address of its host, is kept from the host's
    other users (`targets`: the same on every host)."""
    ssh_of = {h.name: h.address for h in host_targets(config, default_python, loaded.base_dir)}
    allow = allowed([*ssh_of.values(), *(tf.address for tf in tf_of.values() if tf.address)])
    ports: dict[str, list[int]] = {}  # one pass: 10,000 hosts, 10,000 tasks
    for task in tasks:
        ports.setdefault(task.host, []).extend([task.port] if task.port else [])
    targets = tuple(sorted({(address, port) for host, host_ports in ports.items()
                            for address in {ssh_of.get(host), tf_of[host].address
                                            if host in tf_of else None} if address
                            for port in host_ports}))
    seals = {}
    for host, host_ports in ports.items():
        seal = seal_for(config.name, run_dir, host, host_ports, allow,
                        config.security.tf_ports, targets)
        if seal is not None:
            seals[host] = seal
    return seals


@dataclass(frozen=True)
class _Slot:
    """One task's place before ports and environment: role, index, host, GPUs."""

    role: str
    index: int
    target: HostTarget
    gpus: tuple[int, ...]


def _slots(config: ClusterConfig, targets: list[HostTarget]) -> list[_Slot]:
    """Every task in role order (the chief first), each role indexed across hosts in order."""
    specs = {(h.name or h.address): h for h in config.hosts}
    slots: list[_Slot] = []
    for role in ROLE_ORDER:
        index = 0
        for target in targets:
            spec = specs[target.name]
            count = effective_roles(config, spec).get(role, 0)
            per_gpu = (spec.tasks_per_host or config.tasks_per_host) == "per_gpu"
            for k in range(count):
                gpus = (target.gpus[k],) if per_gpu and role == "worker" else target.gpus
                slots.append(_Slot(role, index, target, gpus))
                index += 1
    return slots


def _ports(config: ClusterConfig, serving: list[_Slot],
           ports: Sequence[int] | None) -> dict[tuple[str, int], int]:
    """(role, index) -> port for the tasks that serve one, in task order."""
    if ports is None:
        base = config.ports.base
        if not isinstance(base, int):
            raise PlanError("ports.base is 'auto': the caller must pick the ports")
        ports = [base + i for i in range(len(serving))]
    if len(ports) < len(serving):
        raise PlanError(f"{len(serving)} ports needed, {len(ports)} given")
    return {(slot.role, slot.index): ports[i] for i, slot in enumerate(serving)}


def _task(config: ClusterConfig, slot: _Slot, tf: TFAddress, cluster: dict[str, list[str]],
          frozen_cluster: Mapping[str, Any], port_of: dict[tuple[str, int], int],
          common_env: dict[str, str],
          command: Sequence[str], run_dir: str, workdir: str) -> Task:
    role, index, target = slot.role, slot.index, slot.target
    env = dict(common_env)
    env.update(MGPU_TASK_TYPE=role, MGPU_TASK_INDEX=str(index), MGPU_HOST=target.name,
               MGPU_RUN_DIR=host_run_dir(run_dir, config.transport, target.name))
    if slot.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in slot.gpus)
    if config.strategy == Strategy.KERAS_DISTRIBUTION:
        env.update(keras_distribution_env(config, cluster, role, index))
    tf_config = MappingProxyType({"cluster": frozen_cluster,
                                  "task": MappingProxyType({"type": role, "index": index})})
    runs_server = config.strategy == Strategy.PARAMETER_SERVER and role in ("worker", "ps")
    return Task(
        host=target.name,
        role=role,
        index=index,
        address=tf.shown,
        port=port_of.get((role, index)),
        python=target.python,
        cwd=workdir,
        command=SERVER_COMMAND if runs_server else tuple(command),
        lifetime=_lifetime(config.strategy, role),
        env=MappingProxyType(dict(sorted(env.items()))),
        tf_config=tf_config,
        address_rule=tf.rule,
    )


def _check_roles(strategy: str, roles: list[str]) -> None:
    """A plan (e.g. after hosts were lost) must still be a job TensorFlow can run."""
    workers = roles.count("worker") + roles.count("chief")
    if strategy == Strategy.PARAMETER_SERVER and not (
            roles.count("chief") == 1 and "ps" in roles and "worker" in roles):
        raise PlanError("parameter_server needs its chief, a ps and a worker; the hosts "
                        f"left give {sorted(set(roles))}")
    if strategy == Strategy.LEGACY_SERVER and not workers:
        raise PlanError("legacy_server needs a worker; none is left")
    if strategy in COLLECTIVE and not workers:
        raise PlanError("no worker left to run on")


def resolve_script(command: Sequence[str], cwd: Path) -> tuple[str, ...]:
    """Make the script path absolute when it exists here (local transport)."""
    script, *args = command
    path = Path(script)
    if not path.is_absolute() and (cwd / path).exists():
        script = str((cwd / path).resolve())
    return (script, *args)
