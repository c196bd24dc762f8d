"""A TensorFlow server for this task: `python -m launcher.runtime.server`.

Owns the worker and ps tasks of a `parameter_server` job: the chief (the
coordinator) runs the training script and sends work to these servers through
`ClusterCoordinator`; they only serve. TensorFlow servers never exit by
themselves, so this one blocks until the launcher stops it, and exits 0 on
SIGTERM or SIGINT (a stop the launcher asked for is not a failure).

Also used by `runtime.legacy_session()` for the ps tasks of a `legacy_server`
job (`serve_forever`).

TensorFlow is imported inside the functions. Must not import the launcher side.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

# How often the main thread looks at the stop flag: bounds the exit delay
# after SIGTERM, since TensorFlow's threads may receive the signal.
POLL_S = 0.5


def task_from_env() -> tuple[dict, str, int]:
    """(cluster, task type, task index) from `TF_CONFIG`."""
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        raise SystemExit("launcher.runtime.server: TF_CONFIG is not set")
    config = json.loads(raw)
    task = config.get("task", {})
    kind, index = task.get("type"), int(task.get("index", 0))
    cluster = config.get("cluster", {})
    if kind not in cluster or index >= len(cluster[kind]):
        raise SystemExit(
            f"launcher.runtime.server: task {kind}{index} is not in TF_CONFIG's cluster "
            f"(jobs: {sorted(cluster)}); only chief/worker/ps tasks serve"
        )
    return cluster, kind, index


_stop = threading.Event()


def catch_stop_signals() -> None:
    """From now on SIGTERM/SIGINT only set the stop flag (call early: before TF loads)."""

    def handler(signum, frame):  # noqa: ARG001
        _stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def wait_for_stop() -> None:
    """Block until SIGTERM or SIGINT; then return (the caller exits)."""
    catch_stop_signals()
    while not _stop.wait(POLL_S):
        pass


def exit_now(code: int = 0) -> None:
    """Exit without running TensorFlow's teardown (a serving gRPC server can hang it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve_forever(server, kind: str, index: int, address: str) -> None:
    """Announce, block until stopped, exit 0. Never returns."""
    print(f"mgpu-launch: {kind}{index} serving at {address}; waiting to be stopped",
          flush=True)
    wait_for_stop()
    print(f"mgpu-launch: {kind}{index} stopped", flush=True)
    exit_now(0)


def main() -> None:
    catch_stop_signals()
    cluster, kind, index = task_from_env()
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=kind,
        task_index=index,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    serve_forever(server, kind, index, cluster[kind][index])


if __name__ == "__main__":
    main()
