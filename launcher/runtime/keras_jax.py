"""Keras 3 on JAX across processes (`strategy: keras_distribution`).

Keras 3's multi-process path is `keras.distribution.initialize()`, which
reads `KERAS_DISTRIBUTION_JOB_ADDRESSES`, `..._NUM_PROCESSES` and
`..._PROCESS_ID` (the launcher's plan sets them) and, on JAX, calls
`jax.distributed.initialize` with the first address as coordinator. Owns:

- `distribution()`: that initialize (once), then a `DataParallel` over every
  device of every process, set as the Keras distribution;
- `shard_arrays()`: each process's share of in-memory arrays;
- the JAX settings a task needs before `jax.distributed.initialize` runs,
  also when the script calls `keras.distribution.initialize()` itself (the
  bootstrap installs `HOOKS`): the coordination service's heartbeat, shutdown
  and initialization timeouts from the restart policy (`MGPU_JAX_*`; JAX's
  defaults are 100 s, 300 s and 300 s, and it reads no variable for them),
  CPU collectives over gloo on hosts without accelerators, and `cluster`
  joining/joined reports to the launcher;
- chief-only writes of Keras 3's `BackupAndRestore` and `ModelCheckpoint`.
  On JAX every process must still run the save: saving creates Keras
  variables, and each variable creation under a multi-process distribution is
  a collective (`device_put` checks the value is the same everywhere), so a
  save on process 0 alone deadlocks or fails the next step. The others save to
  a temporary directory deleted at once (`keras_savers`' fixes).

Standard library at import time; jax and Keras are imported when called.
Shipped to hosts. Must not import the launcher side.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from types import ModuleType

from ..strategy import Strategy

ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
JAX_DISTRIBUTED = "jax.distributed"
# Defaults when the plan set none (the restart policy's own defaults).
_TIMEOUTS = (("heartbeat_timeout_seconds", "MGPU_JAX_HEARTBEAT_S", 10),
             ("shutdown_timeout_seconds", "MGPU_JAX_SHUTDOWN_S", 300),
             ("initialization_timeout", "MGPU_JAX_INIT_TIMEOUT_S", 600))
_MARK = "_mgpu_wrapped"
_state: dict[str, object] = {}


class KerasDistributionError(RuntimeError):
    """The task cannot train with Keras 3's distribution (wrong backend, ...)."""


# ----------------------------------------------------------------- identity


def cluster_env() -> dict[str, str]:
    """The three `KERAS_DISTRIBUTION_*` values of this process.

    From the environment (the launcher sets them under keras_distribution);
    else derived from `TF_CONFIG` (any other strategy's plan, e.g. `--local N`):
    the chief and workers in order, process 0 the first, its address JAX's
    coordinator. One process when neither is set.
    """
    if os.environ.get(NUM_PROCESSES):
        return {key: os.environ.get(key, "") for key in (ADDRESSES, NUM_PROCESSES, PROCESS_ID)}
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        config = {}
    cluster, task = config.get("cluster", {}), config.get("task", {})
    addresses = [*cluster.get("chief", []), *cluster.get("worker", [])]
    if len(addresses) < 2 or task.get("type") not in ("chief", "worker"):
        return {ADDRESSES: "", NUM_PROCESSES: "1", PROCESS_ID: "0"}
    before = len(cluster.get("chief", [])) if task["type"] == "worker" else 0
    return {ADDRESSES: ",".join(addresses), NUM_PROCESSES: str(len(addresses)),
            PROCESS_ID: str(before + int(task.get("index", 0)))}


def num_processes() -> int:
    """How many processes train together (1 without a cluster)."""
    return int(cluster_env()[NUM_PROCESSES] or 1)


def process_id() -> int:
    """This process's id, 0 to `num_processes() - 1`; 0 is the chief."""
    return int(cluster_env()[PROCESS_ID] or 0)


def active() -> bool:
    """A task of a `strategy: keras_distribution` job of several processes."""
    return os.environ.get("MGPU_STRATEGY") == Strategy.KERAS_DISTRIBUTION and num_processes() > 1


# -------------------------------------------------------------------- input


def shard_arrays(*arrays, process: int | None = None, count: int | None = None):
    """This process's share of in-memory arrays: every `count`-th example,
    from `process` on (defaults: this process, all processes).

    Every share has the same length (the remainder is dropped): each process
    must run as many steps as the others, or the last step's collective waits
    for ever. Returns one array for one argument, else a tuple.
    """
    if not arrays:
        raise ValueError("shard_arrays needs at least one array")
    count = num_processes() if count is None else count
    process = process_id() if process is None else process
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"arrays of different lengths {sorted(lengths)} cannot be sharded "
                         "together")
    each = lengths.pop() // count
    if each == 0:
        raise ValueError(f"fewer examples than the {count} processes: some would get none")
    shares = tuple(a[process::count][:each] for a in arrays)
    return shares[0] if len(shares) == 1 else shares


# ---------------------------------------------------------------------- JAX


def cpu_only() -> bool:
    """No accelerator plugin installed, or JAX limited to the CPU: decided
    without starting JAX's backends (they must start after initialize)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return True
    from importlib import metadata  # here: ~0.1 s at every task's start otherwise

    accelerated = ("jax-cuda", "jax_cuda", "jax-rocm", "jax_rocm", "libtpu", "jax-tpu")
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(accelerated):
            return False
    return True


def _timeout(env_name: str, default: int) -> int:
    try:
        return max(1, int(float(os.environ.get(env_name, default))))
    except ValueError:
        return default


def on_jax_distributed(module: ModuleType) -> None:
    """Post-import hook of `jax.distributed`: wrap `initialize` (idempotent)."""
    original = module.initialize
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def initialize(*args, **kwargs):
        for name, env_name, default in _TIMEOUTS:
            kwargs.setdefault(name, _timeout(env_name, default))
        _cpu_collectives()
        _report_cluster("joining")
        result = original(*args, **kwargs)
        _report_cluster("joined")
        return result

    setattr(initialize, _MARK, True)
    module.initialize = initialize


def _cpu_collectives() -> None:
    """Multi-process collectives on CPU need an implementation (gloo); set it
    unless the user chose one (JAX_CPU_COLLECTIVES_IMPLEMENTATION)."""
    if os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION") or not cpu_only():
        return
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _report_cluster(state: str) -> None:
    """`joining`/`joined`: the launcher's `restart.start_timeout_s` names who
    never joined (same record as TensorFlow's, see guards.report_cluster)."""
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    try:
        os.write(int(fd), (json.dumps({"cluster": state}) + "\n").encode())
    except OSError:
        pass


# -------------------------------------------------------------------- Keras


def _chief_only_writes(module: ModuleType) -> None:
    """Post-import hook of Keras 3's backup/checkpoint callback modules (also
    applied by `initialize`): chief-only writes (see the module doc), by the
    same capability-checked fixes (runtime/keras_savers.py) as under TensorFlow; where
    one cannot apply (a changed private signature), every process writes and
    the task says so."""
    from . import keras_patch, keras_savers

    fixes = (("BackupAndRestore", keras_savers.fix_backup_and_restore),
             ("ModelCheckpoint", keras_savers.fix_model_checkpoint))
    for name, fix in fixes:
        cls = getattr(module, name, None)
        if cls is None:
            continue
        try:
            fix(cls)
        except keras_patch.CannotPatch as exc:
            keras_patch.announce(
                f"Keras {keras_patch.keras_version()}: cannot make {name} write from the "
                f"chief only ({exc}); every process writes its files")
            continue
        if name == "BackupAndRestore":
            keras_savers.atomic_backups(cls, keras_patch.is_chief)




BACKUP = "keras.src.callbacks.backup_and_restore"
CHECKPOINT = "keras.src.callbacks.model_checkpoint"


def initialize() -> None:
    """`keras.distribution.initialize()` once, with the launcher's settings.

    Must run before any JAX computation. Nothing to do for one process.
    """
    if _state.get("initialized"):
        return
    values = cluster_env()
    backend = _backend()
    if int(values[NUM_PROCESSES] or 1) > 1:
        if backend != "jax":
            raise KerasDistributionError(
                f"Keras runs on the {backend!r} backend; mgpu-launch's keras_distribution "
                "runs Keras 3 on JAX: set `keras: jax` in the cluster file, or "
                "KERAS_BACKEND=jax before the script imports keras")
        os.environ.update(values)  # what keras.distribution.initialize() reads
        import jax

        on_jax_distributed(jax.distributed)
        import keras

        keras.distribution.initialize()
        for name in (BACKUP, CHECKPOINT):
            _chief_only_writes(importlib.import_module(name))
        from . import keras_patch

        keras_patch.announce(f"Keras {keras.__version__} on JAX {jax.__version__}, process "
                              f"{jax.process_index()} of {jax.process_count()}")
    _state["initialized"] = True


def _backend() -> str:
    import keras

    return keras.backend.backend()


def distribution(auto_shard_dataset: bool = True):
    """Initialize (once) and set a `keras.distribution.DataParallel` over every
    device of every process; returns it.

    Each process feeds its own batches, which together make the global batch
    (`batch_size` in `fit` is per process). `auto_shard_dataset=True` (Keras'
    default) lets Keras shard a `tf.data.Dataset` between processes; with
    in-memory arrays take this process's share with `shard_arrays(...)` and
    pass `auto_shard_dataset=False` (Keras refuses arrays otherwise).
    """
    initialize()
    import keras

    existing = _state.get("distribution")
    if existing is not None and existing.auto_shard_dataset == auto_shard_dataset:
        keras.distribution.set_distribution(existing)
        return existing
    chosen = keras.distribution.DataParallel(devices=keras.distribution.list_devices(),
                                             auto_shard_dataset=auto_shard_dataset)
    keras.distribution.set_distribution(chosen)
    _state["distribution"] = chosen
    return chosen


HOOKS = {JAX_DISTRIBUTED: on_jax_distributed, BACKUP: _chief_only_writes,
         CHECKPOINT: _chief_only_writes}
