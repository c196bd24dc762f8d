"""TensorFlow adjustments the bootstrap makes in a task before the script runs.

Owns post-import hooks on TensorFlow's distribute modules:

- single-host strategies in a multi-worker job: `MirroredStrategy` (and
  `OneDeviceStrategy`) ignore `TF_CONFIG`, so a script written for one machine,
  started as several workers, would train alone in every process and have all of
  them write the same checkpoints. A worker of a multi-worker cluster that builds
  one fails at once with an error naming the fix.
- the coordination-service heartbeat timeout (`MGPU_TF_HEARTBEAT_S`): MWMS
  configures TensorFlow's coordination service only when nothing configured it
  before (`context().coordination_service is None`); configuring it just before
  MWMS does, with the same jobs and leader plus a heartbeat timeout, sets how
  long a silent peer is tolerated without touching the script (the plan sets
  15 s, longer than TF's 10 s: a frozen or starved task must survive a few
  seconds; the launcher sees a stopped task itself). The shutdown barrier is
  left alone (shortening it hangs exits).
  This reaches private TensorFlow code: if it moved, the task keeps TF's
  defaults and says so in one warning line.
- SIGTERM given back to Python after MWMS's cluster setup, which installs
  TensorFlow's own handler (a C++ preemption notifier) over Python's: a
  SIGTERM then did nothing unless a `PreemptionCheckpointHandler` listened,
  so every stop of the job (Ctrl-C, a teardown after a failure, a
  preemption) waited out the launcher's grace for its SIGKILL, and a
  script's own SIGTERM handler, set before the strategy, never ran. A
  SIGTERM during a save (runtime/position.py's save phase: Keras' `save`,
  `save_weights`, a `tf.train.Checkpoint`'s or its manager's) waits for the
  save's end, so a file Keras writes in place (`latest.weights.h5`) is never
  cut in half by a stop; the grace's SIGKILL still bounds it.
- `Server.join()` waits in Python, so the launcher's SIGTERM ends a ps task
  with exit code 0 instead of death by signal.

Standard library at import time; TensorFlow is reached only through the modules
the hooks receive. Must not import the launcher side.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from types import ModuleType

SERVER_LIB = "tensorflow.python.training.server_lib"
MIRRORED = "tensorflow.python.distribute.mirrored_strategy"
ONE_DEVICE = "tensorflow.python.distribute.one_device_strategy"
COLLECTIVE = "tensorflow.python.distribute.collective_all_reduce_strategy"
_MARK = "_mgpu_guarded"


class SingleHostStrategyError(RuntimeError):
    """A worker of a multi-worker job built a strategy that ignores TF_CONFIG."""


class StrategyCreatedTwiceError(RuntimeError):
    """A second MultiWorkerMirroredStrategy in one process of a multi-worker job."""


# MultiWorkerMirroredStrategy set-ups in this process: a second one joins the
# cluster again and later dies in a collective ("Delete called on non-empty
# BufRendezvous"), far from the line that caused it.
_multi_worker_setups = 0


def _num_workers() -> int:
    try:
        return int(os.environ.get("MGPU_NUM_WORKERS", "1"))
    except ValueError:
        return 1


def single_host_strategy_message(name: str) -> str:
    kind = os.environ.get("MGPU_TASK_TYPE", "worker")
    index = os.environ.get("MGPU_TASK_INDEX", "0")
    return (
        f"{kind}{index} of {_num_workers()} workers builds tf.distribute.{name}, a "
        "single-host strategy: use tf.distribute.MultiWorkerMirroredStrategy() or "
        "runtime.strategy() instead. Why: it ignores TF_CONFIG, so every worker would "
        "train alone on its own copy of the model and all of them would write the same "
        "checkpoints. MultiWorkerMirroredStrategy uses every GPU of every host. To run "
        "it anyway, set MGPU_ALLOW_SINGLE_HOST_STRATEGY=1."
    )


def _should_refuse() -> bool:
    return (
        _num_workers() > 1
        and os.environ.get("MGPU_TASK_TYPE", "worker") in ("chief", "worker")
        and os.environ.get("MGPU_ALLOW_SINGLE_HOST_STRATEGY") != "1"
    )


def _guard_class(cls: type, name: str) -> None:
    if cls.__dict__.get(_MARK):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        if _should_refuse():
            raise SingleHostStrategyError(single_host_strategy_message(name))
        original(self, *args, **kwargs)

    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__
    setattr(cls, _MARK, True)


def on_mirrored(module: ModuleType) -> None:
    for cls_name in ("MirroredStrategy", "MirroredStrategyV1"):
        cls = getattr(module, cls_name, None)
        if cls is not None:
            _guard_class(cls, "MirroredStrategy")


def on_one_device(module: ModuleType) -> None:
    for cls_name in ("OneDeviceStrategy", "OneDeviceStrategyV1"):
        cls = getattr(module, cls_name, None)
        if cls is not None:
            _guard_class(cls, "OneDeviceStrategy")


def heartbeat_s() -> float | None:
    raw = os.environ.get("MGPU_TF_HEARTBEAT_S", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def report_cluster(state: str) -> None:
    """Tell the launcher this task is `joining` / has `joined` the cluster (it
    names the tasks that never join when `restart.start_timeout_s` runs out)."""
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    try:
        os.write(int(fd), (json.dumps({"cluster": state}) + "\n").encode())
    except (OSError, ValueError):
        pass  # best effort, as all progress reports


def on_collective(module: ModuleType) -> None:
    """Around MWMS's cluster setup: report joining/joined, and configure the
    coordination service (with our heartbeat) just before MWMS does.

    Private TensorFlow code: when `_initialize_multi_worker` is gone, MWMS runs
    as TensorFlow ships it (TF's heartbeat), with a one-line warning."""
    seconds = heartbeat_s()
    extended = getattr(module, "CollectiveAllReduceExtended", None)
    if extended is None or extended.__dict__.get(_MARK):
        return
    original = extended.__dict__.get("_initialize_multi_worker")
    if original is None:
        warn_tf_moved("CollectiveAllReduceExtended._initialize_multi_worker is gone")
        return

    def _initialize_multi_worker(self, cluster_resolver, *args, **kwargs):
        global _multi_worker_setups
        _multi_worker_setups += 1
        if _multi_worker_setups > 1:
            raise StrategyCreatedTwiceError(
                "MultiWorkerMirroredStrategy is created a second time in this process: "
                "each creation joins the cluster again, and the job would die later in a "
                "collective (\"Delete called on non-empty BufRendezvous\"). Create it once "
                "(e.g. at the top of the script) and reuse it; runtime.strategy() returns "
                "the same strategy on every call.")
        report_cluster("joining")
        if seconds is not None:
            configure_coordination_service(cluster_resolver, seconds, module)
        result = original(self, cluster_resolver, *args, **kwargs)
        give_sigterm_back()
        report_cluster("joined")
        return result

    extended._initialize_multi_worker = _initialize_multi_worker
    setattr(extended, _MARK, True)


def give_sigterm_back() -> None:
    """Put back Python's SIGTERM handler (the default, to end; or the script's
    own) over the one TensorFlow's cluster setup installed in C++, which
    Python does not see (`signal.getsignal` still names Python's). A
    `PreemptionCheckpointHandler` (tf_keras' `save_before_preemption`,
    `runtime.callbacks(save_on_sigterm=True)`) installs its own later, as
    before. Only the main thread may set a handler: elsewhere, left as is."""
    global _sigterm_ours
    handler = signal.getsignal(signal.SIGTERM)
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        _sigterm_ours = handler is signal.SIG_DFL


_sigterm_ours = False  # SIGTERM given back with nothing of the script's on it
_saves_open = 0  # saves begun in the main thread and not ended
_sigterm_deferred = False


def hold_sigterm() -> None:
    """A save begins: a SIGTERM that comes now ends the task at the save's end
    (`release_sigterm`), not halfway through its files. Only where SIGTERM was
    given back and is still the default (a script's or a preemption handler's
    own is left to decide), in the main thread (the only one that may set a
    handler)."""
    global _saves_open
    if not _sigterm_ours or threading.current_thread() is not threading.main_thread():
        return
    _saves_open += 1
    if _saves_open == 1 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _defer_sigterm)


def release_sigterm() -> None:
    """A save ended (or raised): the default again, and a SIGTERM that came
    meanwhile ends the task now, by SIGTERM, as it would have."""
    global _saves_open
    if not _saves_open or threading.current_thread() is not threading.main_thread():
        return
    _saves_open -= 1
    if _saves_open:
        return
    if signal.getsignal(signal.SIGTERM) is _defer_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _sigterm_deferred:
            os.kill(os.getpid(), signal.SIGTERM)


def _defer_sigterm(signum: int, frame: object) -> None:
    global _sigterm_deferred
    _sigterm_deferred = True


def warn_tf_moved(what: str) -> None:
    """One line: a private TensorFlow API the heartbeat hook uses has moved."""
    import sys

    version = getattr(sys.modules.get("tensorflow"), "__version__", "?")
    print(f"mgpu-launch: warning: TensorFlow {version}: {what}; using TensorFlow's default "
          "coordination heartbeat timeout (10 s, not "
          f"{os.environ.get('MGPU_TF_HEARTBEAT_S', '15')} s)", file=sys.stderr, flush=True)


def _coordination_config(module: ModuleType | None) -> ModuleType:
    """The protobuf module MWMS itself uses (its path moved between TF 2.16 and 2.19)."""
    found = getattr(module, "coordination_config_pb2", None)
    if found is not None:
        return found
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    except ImportError:
        from tensorflow.tsl.protobuf import coordination_config_pb2
    return coordination_config_pb2


def configure_coordination_service(cluster_resolver, seconds: float,
                                   module: ModuleType | None = None) -> bool:
    """What MWMS would configure, plus `heartbeat_timeout_in_ms`; False if not
    ours to do, or if TensorFlow's private API moved (then TF's defaults, warned)."""
    try:
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context

        if context.context().coordination_service is not None:
            return False  # the script (or TF) configured it already: leave theirs
        cluster_spec = multi_worker_util.normalize_cluster_spec(
            cluster_resolver.cluster_spec())
        if cluster_resolver.task_type not in ("chief", "worker"):
            return False
        pb2 = _coordination_config(module)
        jobs = [
            pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in cluster_spec.jobs
        ]
        context.context().configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(cluster_spec),
            coordinated_jobs=jobs,
            heartbeat_timeout_in_ms=int(seconds * 1000),
        )
    except (ImportError, AttributeError, TypeError) as exc:
        warn_tf_moved(f"its private coordination-service API moved ({type(exc).__name__}: "
                      f"{str(exc)[:160]})")
        return False
    return True


def on_server_lib(module: ModuleType) -> None:
    """`Server.join()` that the launcher can stop: exit 0 on SIGTERM, not death by signal.

    A TF1 ps (or a TF2 PS-strategy worker script) ends in `server.join()`,
    which blocks in C++ forever, where Python never runs a signal handler. The
    launcher stops such tasks when training is done; waiting in Python instead
    lets that stop end the task cleanly.
    """
    cls = module.Server
    if cls.__dict__.get(_MARK) or not os.environ.get("MGPU_TASK_TYPE"):
        return

    def join(self):
        from . import server

        kind = os.environ.get("MGPU_TASK_TYPE", "?")
        index = os.environ.get("MGPU_TASK_INDEX", "0")
        server.serve_forever(self, kind, int(index), self.target)

    join.__doc__ = cls.join.__doc__
    cls.join = join
    setattr(cls, _MARK, True)


HOOKS = {MIRRORED: on_mirrored, ONE_DEVICE: on_one_device, COLLECTIVE: on_collective,
         SERVER_LIB: on_server_lib}


def several_workers(tf_config: str | None = None) -> bool:
    """TF_CONFIG (this text, else the environment's) names more than one
    chief/worker (the MWMS case); False when it is not JSON."""
    try:
        raw = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        cluster = json.loads(raw or "{}").get("cluster", {})
    except ValueError:
        return False
    return len(cluster.get("chief", [])) + len(cluster.get("worker", [])) > 1
