"""Load and validate the cluster YAML.

Owns: the schema of the cluster file (pydantic models; a host entry and the
`ssh:` section are launcher.spec.hosts'), the checks that span several keys
(roles a strategy needs, distinct host names, a shared checkpoint directory),
and loading: `load_config`, `parse_config`, `revalidate`, `local_config`,
`dump_config`. Every problem becomes a `ConfigError` line naming the file, the
line, the key path and what was expected (launcher.spec.problems words them);
secret-looking `env:` values are masked in the dump (launcher.spec.redact).

Must not import: plan, transport, supervisor, cli (the flow is one-way).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from ..strategy import ON_JAX, Strategy
from . import transports
from .hosts import ROLES, HostSpec, SSHSettings, interface_name
from .outlets import MetricsSettings, NotifySettings
from .problems import ConfigError, describe, dotted, line_for, not_utf8, not_yaml, read_yaml
from .redact import redact_env
from .strict import Strict as _Strict

# MGPU_* variables a user may set in `env:` to tune the runtime in the tasks
# (all other MGPU_* names are set by the launcher for each task).
RUNTIME_KNOBS = frozenset({
    "MGPU_CPU_DEVICES",  # split the CPU into N logical devices (replicas without GPUs)
    "MGPU_COLLECTIVE_TIMEOUT_S",  # bound a stuck collective in runtime.strategy()
    "MGPU_TF_HEARTBEAT_S",  # TF coordination heartbeat (default 3)
    "MGPU_KERAS_UNTESTED",  # run the Keras 3 patches on an untested Keras version
    "MGPU_ALLOW_SINGLE_HOST_STRATEGY",  # allow MirroredStrategy in a multi-worker job
    "MGPU_STACKS_SIGNAL",  # the signal on which a task dumps its Python stacks (off: none)
    "MGPU_STEPS_EVERY_S",  # how often the optimizer's step counter is read (0: never)
    "MGPU_MEMORY_PEER",  # 0: the memory tier makes no copy in another host's memory
    # keras_distribution on JAX: the coordination service's timeouts (default:
    # from `restart:`, see taskenv.jax_env)
    "MGPU_JAX_HEARTBEAT_S",
    "MGPU_JAX_SHUTDOWN_S",
    "MGPU_JAX_INIT_TIMEOUT_S",
})
# Knobs the launcher or agent reads as a switch: their values, as a process
# sees them (YAML's false/true are "0"/"1"). The others the runtime reads itself.
KNOB_SWITCHES = frozenset({"MGPU_MEMORY_PEER"})
# Keras backends `strategy: keras_distribution` can run on (`keras:` or KERAS_BACKEND).
KERAS_BACKENDS = ("jax",)
DEFAULT_PORT_BASE = 23456


class CheckpointSettings(_Strict):
    dir: str | None = None
    save_freq: Literal["epoch"] | int = "epoch"
    # Saves complete in host memory, copied to their directory in the background
    # (launcher/runtime/memtier.py, launcher/agent/memcopy.py); off by default.
    memory: bool = False
    # The completed saves each task keeps in memory (the bound of its use).
    memory_copies: int = Field(default=2, ge=1, le=16)
    # With memory: a save to memory every N training steps besides the script's
    # own (Keras BackupAndRestore only: launcher/runtime/memcadence.py).
    memory_interval: int | None = Field(default=None, ge=1)
    # With memory: the chief's saves also copied to another host's memory (a
    # host's loss restores from there); false saves that copy's CPU and memory.
    memory_peer: bool = True

    @model_validator(mode="after")
    def _interval_needs_memory(self) -> CheckpointSettings:
        for key in ("memory_interval", "memory_peer"):
            if key in self.model_fields_set and not self.memory:
                raise ValueError(f"checkpoint.{key} is about saves to host memory: it needs "
                                 "checkpoint.memory: true")
        return self

    @field_validator("save_freq")
    @classmethod
    def _positive_steps(cls, value: str | int) -> str | int:
        if isinstance(value, int) and value <= 0:
            raise ValueError("save_freq must be 'epoch' or a positive number of steps")
        return value


class RestartPolicy(_Strict):
    # Restarts after which the checkpointed step had not advanced.
    max_restarts: int = Field(default=3, ge=0)
    # Every restart, progress or not: a job that keeps failing ends some day.
    max_total_restarts: int = Field(default=100, ge=0)
    # Waited before every restart, doubling each time up to backoff_max_s.
    backoff_s: float = Field(default=1.0, ge=0)
    backoff_max_s: float = Field(default=60.0, ge=0)
    # Every task started and the cluster formed within this, or a failure naming who is missing.
    start_timeout_s: float = Field(default=600.0, gt=0)
    heartbeat_timeout_s: float = Field(default=10.0, gt=0)
    hang_timeout_s: float = Field(default=300.0, gt=0)
    # A task idle this long at the final step after a peer exited 0 is done:
    # stopped, the job succeeds (launcher/job/detect/tailcut.py); 0: wait for every
    # exit (also for a task whose program is over but whose interpreter lingers).
    finished_idle_s: float = Field(default=5.0, ge=0)
    # A task at that final step whose script returned but whose exit handlers
    # (atexit: an upload) have not finished is cut only after sitting idle this
    # long, and the cut says so; 0: exit handlers are never cut.
    exit_handlers_s: float = Field(default=60.0, ge=0)
    on_host_loss: Literal["wait", "shrink"] = "wait"
    min_workers: int = Field(default=1, ge=1)
    # With on_host_loss: wait, how long to wait for a lost host to come back.
    host_wait_s: float = Field(default=300.0, gt=0)
    # SIGTERM -> SIGKILL grace when tasks are stopped (teardown, Ctrl-C).
    grace_s: float = Field(default=3.0, ge=0)
    # Each agent keeps one interpreter per task with TensorFlow imported, for
    # the next start of that task (a warm restart); `off`: every start is cold.
    warm_standby: Literal["auto", "off"] = "auto"
    # A task of a synchronous job named slower than its peers (docs/stragglers.md):
    # `warn` says so; `replace` restarts at the next checkpoint with a spare in its place.
    on_straggler: Literal["warn", "replace"] = "warn"

    @field_validator("warm_standby", mode="before")
    @classmethod
    def _yaml_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false (and `on` as true).
        if isinstance(value, bool):
            return "auto" if value else "off"
        return value


class PortSettings(_Strict):
    base: Literal["auto"] | int = DEFAULT_PORT_BASE

    @field_validator("base")
    @classmethod
    def _port_range(cls, value: str | int) -> str | int:
        if isinstance(value, int) and not 1024 <= value <= 65000:
            raise ValueError("ports.base must be 'auto' or a port between 1024 and 65000")
        return value


# Bad batches a job skips at most (`sentinel: {max_skips}`): a batch whose loss
# went non-finite at the same step after the restart from the save before it.
DEFAULT_MAX_SKIPS = 2


class SecuritySettings(_Strict):
    # Who may connect to the job's TensorFlow ports (docs/security.md):
    # `auto` keeps them to the cluster's hosts wherever the agent can install
    # firewall rules and says so in one line where it cannot; `cluster` refuses
    # to start a job it cannot seal; `open` installs nothing.
    tf_ports: Literal["auto", "cluster", "open"] = "auto"


class SentinelSettings(_Strict):
    """`sentinel: {on_spike, spike_z, spike_window, max_skips}`: the sentinel on,
    what a loss spike is (launcher/runtime/spikes.py; None: its default) and does:
    `report` (an event), `rollback` (handled as a loss gone non-finite), `off`;
    and how many bad batches a job may skip (job/detect/sentinel.py; 0: none)."""

    on_spike: Literal["report", "rollback", "off"] = "report"
    spike_z: float | None = Field(default=None, gt=0)  # robust z-score (default 12)
    spike_window: int | None = Field(default=None, ge=8, le=100_000)  # steps (default 64)
    max_skips: int = Field(default=DEFAULT_MAX_SKIPS, ge=0, le=1000)


def _sentinel_shape(value: Any) -> str:
    """`sentinel:` is a word (on, off) or settings: one message for either, not both."""
    return "(settings)" if isinstance(value, dict | SentinelSettings) else "(word)"

class ClusterConfig(_Strict):
    name: str = Field(default="job", pattern=r"^[A-Za-z0-9_.\-]+$")

    @model_validator(mode="before")
    @classmethod
    def _local_defaults(cls, data: Any) -> Any:
        """Simulated hosts share this machine: ports default to `auto` (two local
        jobs at once must not collide on fixed ports), and entries that repeat
        an address without a `name:` are named host0, host1, ... by position."""
        if not isinstance(data, dict) or not transports.traits(data.get("transport")).simulated:
            return data
        data = dict(data)
        ports = data.get("ports")
        if ports is None or (isinstance(ports, dict) and "base" not in ports):
            data["ports"] = {**(ports or {}), "base": "auto"}
        hosts = data.get("hosts")
        if isinstance(hosts, list):
            addresses = Counter(str(h.get("address")) for h in hosts if isinstance(h, dict))
            named = []
            for i, host in enumerate(hosts):
                if isinstance(host, dict) and "name" not in host \
                        and addresses[str(host.get("address"))] > 1:
                    host = {**host, "name": f"host{i}"}
                named.append(host)
            data["hosts"] = named
        return data

    # The names of launcher/spec/transports.py's table, in its order.
    transport: Literal[transports.NAMES] = transports.DEFAULT.value  # type: ignore[valid-type]
    python: str | None = None
    workdir: str | None = None
    # The names of launcher/strategy.py's `Strategy` (tests/test_config.py checks).
    strategy: Literal["multi_worker_mirrored", "parameter_server", "legacy_server",
                      "keras_distribution"] = "multi_worker_mirrored"
    # `auto`: the Keras the script gets when run by hand (TensorFlow's default);
    # `tf_keras`/`keras3`: tf.keras is tf_keras / Keras 3 (TF_USE_LEGACY_KERAS);
    # `jax`: Keras 3 on the JAX backend (KERAS_BACKEND=jax), for keras_distribution.
    keras: Literal["auto", "keras3", "tf_keras", "jax"] = "auto"
    tasks_per_host: Literal["one", "per_gpu"] = "one"
    # Every host's TF_CONFIG address is its IPv4 address on this interface
    # (a host's own `network_interface` or `tf_address` wins).
    network_interface: str | None = None
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    # Under `transport: slurm` the hosts may come from the allocation (launcher.spec.allocation).
    hosts: list[HostSpec] = Field(default_factory=list)
    checkpoint: CheckpointSettings = Field(default_factory=CheckpointSettings)
    restart: RestartPolicy = Field(default_factory=RestartPolicy)
    ports: PortSettings = Field(default_factory=PortSettings)
    security: SecuritySettings = Field(default_factory=SecuritySettings)
    # Prometheus metrics and notifications (launcher.spec.outlets).
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    notify: NotifySettings | None = None
    # The NaN sentinel (launcher/runtime/sentinel.py): a Keras loss gone non-finite
    # is named at its step, a save of non-finite weights is no save; `off`: neither.
    # On, with how a loss spike is handled and how many bad batches may be
    # skipped: `{on_spike: rollback, max_skips: 2, ...}`.
    sentinel: Annotated[Annotated[Literal["on", "off"], Tag("(word)")]
                        | Annotated[SentinelSettings, Tag("(settings)")],
                        Discriminator(_sentinel_shape)] = "on"

    _interface = field_validator("network_interface")(interface_name)

    @field_validator("sentinel", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false and `on` as true.
        return ("on" if value else "off") if isinstance(value, bool) else value

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, Any]) -> dict[str, Any]:
        for key in env:
            if not key.replace("_", "a").isalnum() or key[0].isdigit():
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key == "TF_CONFIG" or (key.startswith("MGPU_") and key not in RUNTIME_KNOBS):
                raise ValueError(f"{key} is set by mgpu-launch for each task; remove it")
            if key in KNOB_SWITCHES and _as_process_sees(env[key]) not in ("0", "1"):
                raise ValueError(f"{key} is a switch: 0 (false) or 1 (true), not {env[key]!r}")
        return env

    def env_strings(self) -> dict[str, str]:
        """`env` with every value as the string a process sees."""
        return {key: _as_process_sees(value) for key, value in self.env.items()}

    @property
    def max_skips(self) -> int:
        """`sentinel: {max_skips}`: the bad batches the job may skip (the default
        with `sentinel: on`; `off` watches no loss, so there is none to skip)."""
        if isinstance(self.sentinel, SentinelSettings):
            return self.sentinel.max_skips
        return DEFAULT_MAX_SKIPS if self.sentinel == "on" else 0


def _as_process_sees(value: Any) -> str:
    return ("1" if value else "0") if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config plus where it came from (for messages and paths)."""

    config: ClusterConfig
    source: Path | None  # None for configs built in code (e.g. --local N)
    base_dir: Path  # relative paths in the YAML resolve against this

    def resolve_path(self, value: str | None) -> Path | None:
        if value is None:
            return None
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else (self.base_dir / path).resolve()


def parse_config(text: str, source: str = "<string>", base_dir: Path | None = None) -> LoadedConfig:
    """Validate YAML text. Raises ConfigError with one line per problem."""
    try:
        data, lines = read_yaml(text, source)
    except yaml.YAMLError as exc:
        raise ConfigError(source, [not_yaml(exc, source)]) from None
    if not isinstance(data, dict):
        raise ConfigError(source, [f"{source}:1: expected a mapping of keys (name, hosts, ...)"])
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc, message = describe(error, ClusterConfig)
            line = line_for(lines, loc)
            where = f"{source}:{line}" if line else source
            problems.append(f"{where}: {dotted(loc)}: {message}")
        raise ConfigError(source, problems) from None
    base_dir = base_dir or Path.cwd()
    problems = [f"{source}:{line_for(lines, loc)}: {dotted(loc)}: {msg}"
                for loc, msg in [*_semantic_problems(config),
                                 *_checkpoint_dir_problems(config, base_dir)]]
    if problems:
        raise ConfigError(source, problems)
    return LoadedConfig(config=config, source=None, base_dir=base_dir)


def revalidate(loaded: LoadedConfig, data: dict[str, Any]) -> LoadedConfig:
    """Validate `data` (a changed dump of `loaded.config`, e.g. with the hosts of a
    Slurm allocation filled in) as a config from the same source."""
    source = str(loaded.source or "<generated config>")
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [f"{source}: {dotted(loc)}: {message}"
                                   for loc, message in (describe(e, ClusterConfig)
                                                        for e in exc.errors())]) from None
    problems = [f"{source}: {dotted(loc)}: {msg}" for loc, msg in _semantic_problems(config)]
    if problems:
        raise ConfigError(source, problems)
    return LoadedConfig(config=config, source=loaded.source, base_dir=loaded.base_dir)


def effective_roles(config: ClusterConfig, host: HostSpec) -> dict[str, int]:
    """The tasks a host runs: `roles`, with `worker` = len(gpus) under `per_gpu`."""
    roles = dict(host.roles)
    if (host.tasks_per_host or config.tasks_per_host) == "per_gpu" and roles.get("worker"):
        roles["worker"] = len(host.gpus)
    return roles


Problems = list[tuple[tuple, str]]  # (key path, message)


def _semantic_problems(config: ClusterConfig) -> Problems:
    """Checks that span several keys (pydantic sees one field at a time)."""
    if not config.hosts:
        if transports.traits(config.transport).allocation:
            return []  # the allocation's nodes, once known (launcher.spec.allocation)
        return [(("hosts",), "required key is missing: list at least one host "
                 "(or use `transport: slurm` inside a Slurm allocation)")]
    totals = {role: sum(effective_roles(config, h).get(role, 0)
                        for h in config.hosts if not h.spare)
              for role in ROLES}
    return [*_host_problems(config), *_role_problems(config, totals),
            *_placement_problems(config)]


def _host_problems(config: ClusterConfig) -> Problems:
    """Each host entry: GPUs for per_gpu, a role, a distinct name, what a spare runs."""
    problems: Problems = []
    names = [h.name or h.address for h in config.hosts]
    counts, first = Counter(names), {}  # (counted once: 10,000 hosts are linear)
    for i, name in enumerate(names):
        first.setdefault(name, i)
    for i, host in enumerate(config.hosts):
        if (host.tasks_per_host or config.tasks_per_host) == "per_gpu":
            if not host.gpus:
                problems.append((("hosts", i, "gpus"),
                                 "tasks_per_host is per_gpu but this host lists no `gpus`"))
            if host.roles.get("worker", 0) > 1:
                problems.append((("hosts", i, "roles", "worker"),
                                 "with tasks_per_host: per_gpu the worker count comes from "
                                 "`gpus`; set `worker: 1`"))
        if not any(host.roles.values()):
            problems.append((("hosts", i, "roles"), "this host runs no task; give it a role"))
        if counts[names[i]] > 1 and host.name is None and first[names[i]] != i:
            problems.append(
                (("hosts", i, "address"),
                 f"address {host.address!r} is listed twice; give each entry a distinct `name:`")
            )
        elif counts[names[i]] > 1 and first[names[i]] != i:
            problems.append((("hosts", i, "name"), f"name {names[i]!r} is used twice"))
        if host.spare and set(r for r, n in host.roles.items() if n) - {"worker"}:
            problems.append((("hosts", i, "roles"), "a spare host stands in for a worker: "
                             "give it `roles: {worker: 1}` (the default)"))
    return problems


def _role_problems(config: ClusterConfig, totals: dict[str, int]) -> Problems:
    """The roles the strategy needs (and the Keras it runs with)."""
    problems: Problems = []
    if totals["chief"] > 1:
        problems.append((("hosts",), f"at most one chief, found {totals['chief']}"))
    if totals["evaluator"] > 1:
        problems.append((("hosts",), f"at most one evaluator, found {totals['evaluator']}"))
    if config.strategy == Strategy.MULTI_WORKER_MIRRORED:
        if totals["ps"]:
            problems.append(
                (("strategy",), "multi_worker_mirrored has no ps tasks; "
                 "remove `ps` roles or use strategy: parameter_server")
            )
        if totals["worker"] + totals["chief"] == 0:
            problems.append((("hosts",), "no worker: give at least one host `roles: {worker: 1}`"))
    elif config.strategy == Strategy.PARAMETER_SERVER:
        if totals["chief"] != 1 or totals["ps"] < 1 or totals["worker"] < 1:
            problems.append(
                (("strategy",), "parameter_server needs one chief, at least one ps and one worker "
                 f"(found chief={totals['chief']}, ps={totals['ps']}, worker={totals['worker']})")
            )
    elif config.strategy == Strategy.LEGACY_SERVER and totals["worker"] + totals["chief"] == 0:
        problems.append((("hosts",), "legacy_server needs at least one worker"))
    elif config.strategy == Strategy.KERAS_DISTRIBUTION:
        problems.extend(_keras_distribution_problems(config, totals))
    if config.keras == "jax" and config.strategy not in ON_JAX:
        problems.append(
            (("keras",), f"keras: jax runs Keras 3 on JAX, which trains across hosts with "
             f"strategy: keras_distribution, not {config.strategy}")
        )
    if config.restart.on_straggler == "replace" and not any(h.spare for h in config.hosts):
        problems.append(
            (("restart", "on_straggler"),
             "on_straggler: replace needs a spare host to put in the slow host's place: "
             "add a host with `spare: true`, or use on_straggler: warn")
        )
    workers = totals["worker"] + totals["chief"]
    if config.restart.min_workers > workers:
        problems.append(
            (("restart", "min_workers"),
             f"min_workers={config.restart.min_workers} but the cluster has {workers} workers")
        )
    return problems


def _placement_problems(config: ClusterConfig) -> Problems:
    """What several real hosts need: a shared checkpoint directory, fixed ports."""
    problems: Problems = []
    addresses = {h.address for h in config.hosts}
    if transports.traits(config.transport).ssh and len(addresses) > 1 and not config.checkpoint.dir:
        problems.append(
            (("checkpoint",), "checkpoint.dir is required for a multi-host ssh cluster: "
             "a directory every host sees (NFS or similar), e.g. /shared/ckpt/NAME")
        )
    remote = [h.address for h in config.hosts if not _is_loopback(h.address)]
    if transports.traits(config.transport).ssh and config.ports.base == "auto" and remote:
        problems.append(
            (("ports", "base"), "auto picks ports that are free on this machine, which says "
             f"nothing about {remote[0]}: set a fixed base (check it with `mgpu-launch check`)")
        )
    return problems


# Kernel pseudo-filesystems: nothing can be saved there (/dev/shm can: not /dev).
_PSEUDO_FS = ("/proc", "/sys")


def _checkpoint_dir_problems(config: ClusterConfig, base_dir: Path) -> Problems:
    """`checkpoint.dir` must be a directory a task can write: not under a
    kernel pseudo-filesystem, not a file (nor below one) on this machine."""
    value = config.checkpoint.dir
    if not value:
        return []
    path = Path(os.path.expanduser(value))
    path = Path(os.path.realpath(path if path.is_absolute() else base_dir / path))
    key = ("checkpoint", "dir")
    pseudo = next((root for root in _PSEUDO_FS
                   if path == Path(root) or Path(root) in path.parents), None)
    if pseudo is not None:
        return [(key, f"{value} is under {pseudo}, a kernel pseudo-filesystem where no "
                 "checkpoint can be written: give a directory on a real disk (shared by "
                 "every host)")]
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                what = "is a file" if folder == path else f"is below {folder}, a file"
                return [(key, f"{value} {what}, not a directory: give a directory for "
                         "the checkpoints")]
            break
    return []


def keras_backend(config: ClusterConfig) -> str | None:
    """The Keras 3 backend a keras_distribution job runs on: `keras: jax`, else
    KERAS_BACKEND from `env:` (None when neither names one)."""
    if config.keras == "jax":
        return "jax"
    backend = config.env.get("KERAS_BACKEND")
    return None if backend is None else str(backend)


def _keras_distribution_problems(config: ClusterConfig,
                                 totals: dict[str, int]) -> list[tuple[tuple, str]]:
    """`strategy: keras_distribution`: Keras 3's own multi-process path
    (`keras.distribution.initialize()`), every task one process, no TF roles."""
    problems: list[tuple[tuple, str]] = []
    if config.keras == "tf_keras":
        problems.append((("keras",), "keras_distribution is Keras 3's multi-process path; "
                         "tf_keras has none: set `keras: jax`"))
    backend = keras_backend(config)
    if config.keras == "tf_keras":
        pass  # said above; the backend follows once `keras:` is fixed
    elif config.keras == "jax" and config.env.get("KERAS_BACKEND") not in (None, "jax"):
        problems.append((("env", "KERAS_BACKEND"), f"KERAS_BACKEND={config.env['KERAS_BACKEND']} "
                         "contradicts `keras: jax`; remove one"))
    elif backend is None:
        problems.append((("keras",), "keras_distribution needs the Keras backend: set "
                         "`keras: jax` (or KERAS_BACKEND in `env:`)"))
    elif backend not in KERAS_BACKENDS:
        problems.append((("env", "KERAS_BACKEND"), f"keras_distribution runs on "
                         f"{', '.join(KERAS_BACKENDS)}, not KERAS_BACKEND={backend} (for "
                         "TensorFlow use strategy: multi_worker_mirrored)"))
    for role in ("ps", "evaluator"):
        if totals[role]:
            problems.append((("strategy",), f"keras_distribution runs every task as one "
                             f"training process: no {role} tasks (give hosts `worker` roles)"))
    if totals["worker"] + totals["chief"] == 0:
        problems.append((("hosts",), "no worker: give at least one host `roles: {worker: 1}`"))
    return problems


def _is_loopback(address: str) -> bool:
    return address == "localhost" or address.startswith("127.") or address == "::1"


def load_config(path: str | os.PathLike) -> LoadedConfig:
    """Read and validate a cluster file; relative paths resolve against its folder."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(str(path), [f"{path}: cannot read: {exc.strerror}"]) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), [not_utf8(path, raw, exc.start)]) from None
    loaded = parse_config(text, source=str(path), base_dir=path.resolve().parent)
    return LoadedConfig(config=loaded.config, source=path, base_dir=loaded.base_dir)


def local_config(num_hosts: int, name: str = "local") -> LoadedConfig:
    """The config behind `mgpu-launch --local N`: N simulated hosts on this machine."""
    data = {
        "name": name,
        "transport": transports.TransportName.LOCAL.value,
        "hosts": [{"address": "127.0.0.1", "name": f"host{i}"} for i in range(num_hosts)],
        "ports": {"base": "auto"},
    }
    return LoadedConfig(config=ClusterConfig.model_validate(data), source=None,
                        base_dir=Path.cwd())


def dump_config(loaded: LoadedConfig) -> str:
    """The resolved config as YAML (written to the run directory), secrets masked."""
    data = loaded.config.model_dump(mode="json")
    data["env"] = redact_env(data.get("env") or {})
    # libyaml's emitter where PyYAML has it: the same data (a long quoted string
    # may wrap elsewhere), ~3x less CPU (16 -> 5 ms for 32 hosts, written while
    # every host waits for its task's start).
    return yaml.dump(data, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False)
