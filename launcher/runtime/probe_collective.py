"""A seconds-long collective across the job's tasks: `python -m launcher.runtime.probe_collective`.

`mgpu-launch check` starts this in place of the training script, as a task of
the job's own plan (its TF_CONFIG addresses and ports, its environment: the
coordination heartbeat, the Keras and JAX settings, the collective timeout),
so that a firewall, a wrong address or a broken collective implementation
shows up in seconds, not as a hang at the first training step.

What it tries, by `MGPU_STRATEGY`:
- multi_worker_mirrored: the strategy `runtime.strategy()` builds (the job's
  communication options), then two all-reduce steps (SUM of 1, then of 2, per
  replica; each must equal 1x and 2x the replicas in sync);
- parameter_server (run by the chief; the workers and ps run their usual
  servers): the strategy connects to every worker and ps, then two steps per
  worker, scheduled through `ClusterCoordinator`, add to a variable on a ps;
- keras_distribution: `jax.distributed` joins every process (as Keras does),
  then two cross-process all-gathers.

The result goes to the launcher as one progress record `{"probe": {...}}`
(`ok`, `error`, timings) and as one printed line. Exit 0 when the result is
right, 3 when not.

The bootstrap's hooks are installed first, as for a training script (the
heartbeat and the `joining`/`joined` reports). Standard library and the
runtime; TensorFlow or JAX imported inside the functions. Must not import the
launcher side.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ..strategy import DEFAULT, Strategy

EXIT_WRONG = 3
STEPS = 2


def report(record: dict[str, Any]) -> None:
    """One progress record for the launcher (best effort, as all progress)."""
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    try:
        os.write(int(fd), (json.dumps({"probe": record}) + "\n").encode())
    except (OSError, ValueError):
        pass


def _collective_timeout() -> None:
    """Bound each collective unless the job sets its own bound: a peer that
    cannot be reached fails the step instead of hanging until the launcher's
    deadline."""
    probe = os.environ.get("MGPU_PROBE_COLLECTIVE_TIMEOUT_S")
    if probe and not os.environ.get("MGPU_COLLECTIVE_TIMEOUT_S"):
        os.environ["MGPU_COLLECTIVE_TIMEOUT_S"] = probe


def multi_worker_mirrored() -> dict[str, Any]:
    _collective_timeout()
    import tensorflow as tf

    from launcher import runtime

    began = time.monotonic()
    strategy = runtime.strategy()
    joined = time.monotonic()

    def replica_step(value):
        context = tf.distribute.get_replica_context()
        # Made on the replica's device: an argument may sit elsewhere.
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([]) * value)

    @tf.function
    def step(value):  # as a training step is run: strategy.run inside a tf.function
        return strategy.run(replica_step, args=(value,))

    sums = []
    for k in range(1, STEPS + 1):
        result = step(tf.constant(float(k)))
        sums.append(float(strategy.experimental_local_results(result)[0].numpy()))
    replicas = strategy.num_replicas_in_sync
    expected = [float(k * replicas) for k in range(1, STEPS + 1)]
    devices = sorted({"GPU" if "GPU" in d.upper() else "CPU"
                      for d in strategy.extended.worker_devices})
    return {"ok": sums == expected, "join_s": joined - began,
            "collective_s": time.monotonic() - joined, "sums": sums, "expected": expected,
            "replicas": replicas, "devices": devices,
            "what": f"all-reduce x{STEPS} over {replicas} replicas"}


def parameter_server() -> dict[str, Any]:
    import tensorflow as tf

    began = time.monotonic()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    joined = time.monotonic()
    cluster = resolver.cluster_spec().as_dict()
    workers, ps = len(cluster.get("worker", [])), len(cluster.get("ps", []))
    with strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def step():
        total.assign_add(1.0)
        return total.read_value()

    for _ in range(STEPS * workers):
        coordinator.schedule(step)
    coordinator.join()
    got, expected = float(total.numpy()), float(STEPS * workers)
    return {"ok": got == expected, "join_s": joined - began,
            "collective_s": time.monotonic() - joined, "sums": [got], "expected": [expected],
            "what": f"{STEPS * workers} steps on {workers} workers into a variable on "
                    f"{ps} ps"}


def keras_distribution() -> dict[str, Any]:
    _collective_timeout()
    import numpy as np

    from launcher.runtime import keras_jax

    began = time.monotonic()
    keras_jax.initialize()  # jax.distributed.initialize, as Keras does it
    joined = time.monotonic()
    import jax
    from jax.experimental import multihost_utils

    count, rank = jax.process_count(), jax.process_index()
    sums = []
    for k in range(1, STEPS + 1):
        gathered = multihost_utils.process_allgather(np.array([float(k * (rank + 1))]))
        sums.append(float(np.sum(gathered)))
    expected = [float(k * count * (count + 1) // 2) for k in range(1, STEPS + 1)]
    return {"ok": sums == expected, "join_s": joined - began,
            "collective_s": time.monotonic() - joined, "sums": sums, "expected": expected,
            "what": f"all-gather x{STEPS} across {count} JAX processes"}


PROBES = {Strategy.MULTI_WORKER_MIRRORED: multi_worker_mirrored,
          Strategy.PARAMETER_SERVER: parameter_server,
          Strategy.KERAS_DISTRIBUTION: keras_distribution}


def main() -> int:
    from launcher.bootstrap import install_hooks, register_stacks

    register_stacks()
    install_hooks()
    strategy = os.environ.get("MGPU_STRATEGY", DEFAULT)
    probe = PROBES.get(strategy)
    if probe is None:
        print(f"probe: no collective to try under strategy {strategy}", file=sys.stderr)
        return EXIT_WRONG
    began = time.monotonic()
    try:
        result = probe()
    except Exception as exc:
        message = " ".join(str(exc).split())[:600]
        report({"ok": False, "error": f"{type(exc).__name__}: {message}",
                "seconds": time.monotonic() - began})
        print(f"probe: {type(exc).__name__}: {message}", file=sys.stderr, flush=True)
        return EXIT_WRONG
    result["seconds"] = time.monotonic() - began
    if not result["ok"]:
        result["error"] = f"wrong result: got {result['sums']}, expected {result['expected']}"
    report(result)
    print(f"probe: {result['what']}: {result['sums']} "
          f"({'ok' if result['ok'] else 'WRONG, expected ' + str(result['expected'])})",
          flush=True)
    return 0 if result["ok"] else EXIT_WRONG


if __name__ == "__main__":
    sys.exit(main())
