"""The TF1 between-graph pattern of old Keras code, driven by `TF_CONFIG`.

Owns `legacy_session()` and `device_setter()`, behind the runtime functions of
the same names. Each task starts its `tf.compat.v1.train.Server` from
`TF_CONFIG`; a `ps` task then serves until the launcher stops it (TF1 ps never
exit by themselves); a worker gets a session on its own server, set as the
Keras session with `tf.compat.v1.keras.backend.set_session` (tf_keras has no
`backend.set_session`). Graph mode is switched on first, since a TF1 session
means nothing to eager Keras.

TensorFlow is imported inside the functions. Must not import the launcher side.
"""

from __future__ import annotations

import json
import os

from . import server as _server


def _task() -> tuple[dict, str, int]:
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = config.get("task", {})
    return config.get("cluster", {}), task.get("type", "worker"), int(task.get("index", 0))


def start_server():
    """This task's `tf.compat.v1.train.Server`, or None when run without a cluster."""
    import tensorflow as tf

    cluster, kind, index = _task()
    if not cluster:
        return None
    return tf.compat.v1.train.Server(
        tf.train.ClusterSpec(cluster), job_name=kind, task_index=index,
        config=tf.compat.v1.ConfigProto(allow_soft_placement=True),
    )


def legacy_session(config=None):
    """Start this task's server and make its session the Keras session.

    On a `ps` task this never returns: it serves until the launcher stops the
    task (SIGTERM), then exits 0. Without a cluster, a plain local session.
    """
    import tensorflow as tf

    cluster, kind, index = _task()
    if kind == "ps":
        _server.catch_stop_signals()  # before the server starts: a stop is never lost
    server = start_server()
    if kind == "ps" and server is not None:
        _server.serve_forever(server, kind, index, cluster[kind][index])
    if tf.executing_eagerly():
        tf.compat.v1.disable_eager_execution()
    if config is None and server is not None:
        # See only the ps tasks and this worker: a session must not wait for
        # (or die with) a peer worker that finished first.
        config = tf.compat.v1.ConfigProto(
            device_filters=["/job:ps", f"/job:{kind}/task:{index}"], allow_soft_placement=True)
    target = server.target if server is not None else ""
    session = tf.compat.v1.Session(target=target, config=config)
    tf.compat.v1.keras.backend.set_session(session)
    return session


def device_setter():
    """`replica_device_setter` for this worker: variables on the ps tasks, ops here."""
    import tensorflow as tf

    cluster, kind, index = _task()
    if "ps" not in cluster:
        return None
    return tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:{kind}/task:{index}", cluster=tf.train.ClusterSpec(cluster)
    )
