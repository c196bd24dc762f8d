"""Each task's environment, as the plan builds it: what every task of a job
shares (the launcher's MGPU_* variables, `env:`, the Keras choice, TensorFlow's
and JAX's timeouts) and what Keras 3's multi-process path reads per task.

Owns: the variables and their values; launcher.spec.plan adds each task's own
(MGPU_TASK_TYPE, MGPU_TASK_INDEX, CUDA_VISIBLE_DEVICES, ...). Pure: no file,
socket or environment variable of this process is read.

Must not import: transport, supervisor, cli.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..strategy import ON_JAX, Strategy
from .config import ClusterConfig, keras_backend

# TensorFlow's coordination heartbeat timeout (MGPU_TF_HEARTBEAT_S default): above
# the launcher's own stall bound (job/detect/stalls.py, STOPPED_HANG_S), and more than twice
# the longest freeze that must pass (a frozen leader sees its peers' last heartbeat
# up to half the timeout older than the freeze; the peers' heartbeat calls time out
# with it).
TF_HEARTBEAT_S = 15


def keras_env(keras: str) -> dict[str, str]:
    """`TF_USE_LEGACY_KERAS` for the `keras:` key (read when TensorFlow is imported).

    `auto` sets nothing: each script gets the Keras it gets when run by hand
    (TensorFlow's default, Keras 3 for `tf.keras` since TF 2.16, patched by the
    runtime under MultiWorkerMirroredStrategy; or what `env:` or the script
    itself sets). Forcing tf_keras broke scripts written for Keras 3 through
    `tf.keras` (docs/strategies-and-keras.md).
    """
    if keras == "tf_keras":
        return {"TF_USE_LEGACY_KERAS": "1"}
    if keras == "keras3":
        return {"TF_USE_LEGACY_KERAS": "0"}
    return {}


def jax_env(config: ClusterConfig) -> dict[str, str]:
    """JAX's coordination-service timeouts, from the restart policy (whole
    seconds, as `jax.distributed.initialize` takes them; the runtime passes them).

    - heartbeat: a hung or cut-off process is declared dead, and its peers
      stopped, after `restart.heartbeat_timeout_s` instead of JAX's 100 s;
    - shutdown: the exit barrier waits for slower peers (the chief saving a
      model) up to `restart.hang_timeout_s`, the launcher's own bound on a
      silent task (JAX's default 300 s);
    - initialization: every process joins within `restart.start_timeout_s`.
    """
    restart = config.restart
    return {
        "MGPU_JAX_HEARTBEAT_S": str(max(1, math.ceil(restart.heartbeat_timeout_s))),
        "MGPU_JAX_SHUTDOWN_S": str(max(1, math.ceil(restart.hang_timeout_s))),
        "MGPU_JAX_INIT_TIMEOUT_S": str(max(1, math.ceil(restart.start_timeout_s))),
    }


def keras_distribution_env(config: ClusterConfig, cluster: Mapping[str, Sequence[str]],
                            role: str, index: int) -> dict[str, str]:
    """What `keras.distribution.initialize()` reads: every process's address
    (the first, process 0's, is JAX's coordinator), their count, and this
    task's process id, in TF_CONFIG's order (the chief first)."""
    addresses = [a for r in ("chief", "worker") for a in cluster.get(r, ())]
    before = len(cluster.get("chief", ())) if role == "worker" else 0
    return {
        "KERAS_BACKEND": keras_backend(config) or "jax",
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": ",".join(addresses),
        "KERAS_DISTRIBUTION_NUM_PROCESSES": str(len(addresses)),
        "KERAS_DISTRIBUTION_PROCESS_ID": str(before + index),
    }


def shared_env(config: ClusterConfig, checkpoint_dir: str, generation: int,
                num_workers: int, run_id: str = "") -> dict[str, str]:
    """The environment every task of the job gets."""
    shared_env = {
        # TensorFlow's INFO start-up chatter hides what matters; warnings and
        # errors (the collective aborts the supervisor watches for) still show.
        "TF_CPP_MIN_LOG_LEVEL": "1",
        **config.env_strings(),
        **keras_env(config.keras),
        # Lines reach the launcher as they are printed, not at exit.
        "PYTHONUNBUFFERED": "1",
        "MGPU_CHECKPOINT_DIR": checkpoint_dir,
        "MGPU_GENERATION": str(generation),
        "MGPU_NUM_WORKERS": str(num_workers),
        "MGPU_STRATEGY": config.strategy,
        "MGPU_KERAS": config.keras,
        "MGPU_SAVE_FREQ": str(config.checkpoint.save_freq),
    }
    # runtime/sentinel.py's ENV, said either way: a value inherited from one
    # host's environment must not make its restores judge apart from its peers'.
    shared_env["MGPU_SENTINEL"] = "off" if config.sentinel == "off" else "on"
    if not isinstance(config.sentinel, str):  # `{on_spike: ...}`: runtime/sentinel.py's
        spikes = config.sentinel
        shared_env["MGPU_ON_SPIKE"] = spikes.on_spike
        if spikes.spike_z is not None:
            shared_env["MGPU_SPIKE_Z"] = repr(float(spikes.spike_z))
        if spikes.spike_window is not None:
            shared_env["MGPU_SPIKE_WINDOW"] = str(spikes.spike_window)
    if config.checkpoint.memory:  # the agent gives each task its folder (agent/memcopy.py)
        shared_env["MGPU_MEMORY_COPIES"] = str(config.checkpoint.memory_copies)
        if run_id:  # this run's saves ordered apart from another run's (agent/saveorder.py)
            shared_env["MGPU_RUN_ID"] = run_id
        if config.checkpoint.memory_interval:  # extra saves (runtime/memcadence.py)
            shared_env["MGPU_MEMORY_INTERVAL"] = str(config.checkpoint.memory_interval)
        if not config.checkpoint.memory_peer:  # no second copy (agent/peercopy.py)
            shared_env["MGPU_MEMORY_PEER"] = "0"
    # Long enough to survive a frozen or starved task (stalls.py); a frozen task
    # is a hang by the launcher's own bound, sooner (docs/fault-tolerance.md).
    shared_env.setdefault("MGPU_TF_HEARTBEAT_S", str(TF_HEARTBEAT_S))
    if config.strategy in ON_JAX:
        for key, value in jax_env(config).items():
            shared_env.setdefault(key, value)  # an `env:` value wins
    if config.strategy == Strategy.PARAMETER_SERVER:
        # Fail an RPC to a dead worker at once so the coordinator reschedules it.
        shared_env["GRPC_FAIL_FAST"] = "use_caller"
    return shared_env
