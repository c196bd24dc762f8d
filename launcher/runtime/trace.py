"""Traces on request: this task's process traced for a few seconds, summarised.

The launcher asks every task of a running job to trace at the same moment
(`mgpu-launch profile`, docs/profiles.md). The request reaches the task as a
small JSON file its agent writes (atomically) at `MGPU_PROFILE_REQUEST`:
`{"id", "start_at" (Unix time, the agent's clock), "seconds", "logdir"}`. One
daemon thread, started by the bootstrap, looks for that file every POLL_S
seconds (one `stat`: nothing runs inside the training step), takes it, waits
until `start_at`, and traces the process in-process with
`tf.profiler.experimental.start(logdir)` / `stop()`: no profiler server
listens on a port (docs/security.md: nothing listens beyond what the job
needs). TensorFlow writes `logdir/plugins/profile/<run>/<host>.xplane.pb`.

The trace is then summarised (`xplane.summarise`: time in collective ops, time
waiting for input, the rest is compute) and the summary goes back through the
progress channel as one record `{"profile": {...}}`, which the agent takes out
of the progress stream (launcher/agent/profiles.py) and sends on with the file.

The drill's NaN (`mgpu-launch drill --nan`) comes the same way, in a file of
its own beside it (`<task>.nan`, `{"until": Unix time}`): taken before its
`until`, it spoils this task's weights at the next step (runtime/sentinel.py);
a late one is dropped (the drill has given up on it by then). A trace runs in
a thread of its own, so the NaN's file is looked for during one too.

Light at import time (every task imports it at start: os, threading);
TensorFlow, the summariser and its protos are imported when a trace is asked
for (they are loaded in a training process by then).
Must not import the launcher side.
"""

from __future__ import annotations

import os
import sys
import threading
import time

REQUEST_ENV = "MGPU_PROFILE_REQUEST"
POLL_S = 0.2  # how often the request file is looked for: one stat
MAX_SECONDS = 60.0
MAX_WAIT_S = 30.0  # a start_at further ahead than this is the agent's clock gone wrong


def trace(logdir: str, seconds: float, start_at: float | None = None) -> dict:
    """Trace this process for `seconds` into `logdir`; the record sent back:
    `file` (the xplane.pb), `summary` (TraceSummary.to_json()), `error`."""
    from launcher.runtime import steps as step_counter

    if "tensorflow" not in sys.modules:
        return {"error": "TensorFlow is not loaded in this task"}
    import tensorflow as tf

    if start_at is not None:
        time.sleep(min(max(start_at - time.time(), 0.0), MAX_WAIT_S))
    before = step_counter.current_step()
    started = time.time()
    try:
        tf.profiler.experimental.start(logdir)
    except Exception as exc:  # noqa: BLE001 - e.g. a profiler the script started itself
        return {"error": f"the profiler did not start: {type(exc).__name__}: {exc}"[:500]}
    try:
        time.sleep(seconds)
    finally:
        after = step_counter.current_step()
        tf.profiler.experimental.stop()
    record: dict = {"started": started, "stop_s": round(time.time() - started - seconds, 3)}
    path = _newest_xplane(logdir)
    if path is None:
        record["error"] = f"the profiler wrote no xplane.pb under {logdir}"
        return record
    counted = after - before if before is not None and after is not None else None
    from launcher.runtime.xplane import summarise

    with open(path, "rb") as handle:
        record["summary"] = summarise(handle.read(), counted).to_json()
    record["file"] = path
    return record


def _newest_xplane(logdir: str) -> str | None:
    found = []
    for folder, _dirs, files in os.walk(logdir):
        found += [os.path.join(folder, f) for f in files if f.endswith(".xplane.pb")]
    return max(found, key=os.path.getmtime) if found else None


def _take(path: str) -> dict | None:
    """The JSON object at `path`, the file removed; None: none, or not an object."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
        os.unlink(path)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def take_request(path: str) -> dict | None:
    """The request at `path`, removed; None if there is none or it is malformed."""
    request = _take(path)
    if request is None or not isinstance(request.get("logdir"), str):
        return None
    try:
        request["seconds"] = min(max(float(request.get("seconds", 2.0)), 0.05), MAX_SECONDS)
        request["start_at"] = float(request.get("start_at") or time.time())
    except (TypeError, ValueError):
        return None
    return request


def answer(request: dict) -> None:
    """Trace as asked and send the record back on the progress channel."""
    from launcher import runtime

    try:
        record = trace(request["logdir"], request["seconds"], request["start_at"])
    except Exception as exc:  # noqa: BLE001 - a failed trace must never end the task
        record = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    record["id"] = str(request.get("id", ""))[:100]
    runtime.write_progress({"profile": record})


def nan_path(request_path: str) -> str:
    """Where the drill's NaN for this task comes (beside its trace requests)."""
    return request_path.removesuffix(".request") + ".nan"


def _take_nan(path: str) -> bool:
    """The drill's NaN asked and not yet expired (its `until`); the file removed."""
    until = (_take(path) or {}).get("until")
    return isinstance(until, int | float) and time.time() <= until


def _watch(path: str) -> None:
    from launcher.runtime.threadname import name_this_thread

    name_this_thread("mgpu-profile")
    nan = nan_path(path)
    while True:
        time.sleep(POLL_S)
        if os.path.exists(nan) and _take_nan(nan):
            from launcher.runtime import sentinel

            sentinel.poison_next_step()
        if os.path.exists(path):
            request = take_request(path)
            if request is not None:  # seconds of tracing: the NaN's file is still looked for
                threading.Thread(target=answer, args=(request,), name="mgpu-profile-trace",
                                 daemon=True).start()


def start_watching() -> None:
    """Start the thread that answers trace requests (in a task of the launcher)."""
    path = os.environ.get(REQUEST_ENV)
    if path and os.environ.get("MGPU_PROGRESS_FD"):
        threading.Thread(target=_watch, args=(path,), name="mgpu-profile", daemon=True).start()
