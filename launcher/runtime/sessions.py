"""TF1 graph-mode sessions, zero code: a session forming, and the global step.

The legacy between-graph pattern (`tf.compat.v1.train.Server`,
`MonitoredTrainingSession`, `StopAtStepHook`) counts its steps in the graph's
global step, kept on the ps, not in a Keras optimizer (runtime/steps.py reads
those). A post-import hook on `tensorflow`:

- wraps `SessionManager.prepare_session` (the chief's) and `wait_for_session`
  (every other worker's) to report `cluster: joining` before and `joined` once
  it returned: a session needs every task its devices name, and one waiting for
  a peer that finished and exited waits for ever. The launcher names it and,
  the peer having exited 0, ends the job as finished (launcher/job/detect/tailcut.py);
  a joining task is judged by `restart.start_timeout_s`, not by the hang limit;
  a chief whose session restored nothing (no checkpoint yet: it initialized)
  says where it started, the global step it holds then (0: from the beginning);
- adds to every `MonitoredSession` (hence `MonitoredTrainingSession`) one
  `SessionRunHook` that fetches the global step with the script's own
  `run`, at most once every `MGPU_STEPS_EVERY_S` seconds (default 2; 0: off),
  never a `run` of its own but one at the session's end (the last steps), and
  reports it as the step counter does (`counted`). A script that reports its
  own steps wins, as there;
- wraps `BaseSession.run` for the plain loop (`sess.run(train_op)` with no
  `MonitoredSession`, the global step from `get_or_create_global_step()`):
  after a run returns, when the same period is due (one schedule for the hook
  and every session: a `MonitoredSession`'s own runs find it just taken), the
  graph's global step is read with one `run` of its own (3 s at most), and
  once more as the session closes. A graph with no global step reports
  nothing (no guessed step); one not initialized yet (a worker waiting for
  the chief's init) is not read (asked first, until a read succeeded: a read
  that fails is logged by TensorFlow); a read that fails is dropped until the
  next period, a minute when it failed slowly (a ps out of reach: the read
  must not slow the script). The script's own fetches are never changed: a
  fetch added to its `run` could fail it (an init run, before the global step
  exists on the ps).

Standard library only at import time; TensorFlow is reached through the modules
its import loaded. Must not import the launcher side.
"""

from __future__ import annotations

import sys
import threading
import time
from types import ModuleType

_MARK = "_mgpu_forms_sessions"
_STEP_MARK = "_mgpu_counts_global_steps"
_last_reported: int | None = None
_due = 0.0  # monotonic time of the next read, for the hook and every session
_READ_TIMEOUT_MS = 3000
_SLOW_READ_S, _SLOW_BACKOFF_S = 1.0, 60.0  # a read that failed slowly: the next in a minute
_READ_MARK = "_mgpu_read_global_step"  # on a session whose global step was read
_inside = threading.local()  # fresh: the chief's session restored nothing


def _report(record: dict) -> None:
    from launcher import runtime

    runtime.write_progress(record)


def _forming(original):
    def form(*args, **kwargs):
        from . import guards

        guards.report_cluster("joining")
        result = original(*args, **kwargs)
        guards.report_cluster("joined")
        return result

    return form


def _preparing(original):
    """The chief's `prepare_session`: formed as above; when it restored nothing
    (`_restore_checkpoint` found no checkpoint, the chief initialized), the
    generation started at the global step it holds now: said (0: "from the
    beginning"), as a restore that found nothing says it."""
    form = _forming(original)

    def prepare(*args, **kwargs):
        _inside.fresh = False
        session = form(*args, **kwargs)
        if _inside.fresh:
            try:
                from . import restores, saves

                restores.tell(saves.global_step_of(session))
            except Exception:  # noqa: BLE001, S110 - not read: nothing said, as before
                pass
        return session

    return prepare


def _restoring(original):
    def restore(*args, **kwargs):
        result = original(*args, **kwargs)
        _inside.fresh = isinstance(result, tuple) and len(result) == 2 and result[1] is False
        return result

    return restore


def report_global_step(step: int | None) -> None:
    """The global step read, reported when it moved (the counter's way)."""
    global _last_reported
    from launcher import runtime

    if step is None or step <= 0 or step == _last_reported \
            or runtime.steps_reported_by_script():
        return
    _last_reported = step
    _report({"step": int(step), "time": time.time(), "counted": 1})


def _due_now(period_s: float) -> bool:
    """Is a read due (then the next is `period_s` from now)?"""
    global _due
    now = time.monotonic()
    if now < _due:
        return False
    _due = now + period_s
    return True


def _step_hook(hook_base: type, run_args: type, training_util: ModuleType, period_s: float):
    """A SessionRunHook class (of the script's TensorFlow) that fetches the
    global step with the script's `run` at most once every `period_s`."""

    class GlobalStep(hook_base):
        def begin(self):
            self._tensor = training_util.get_global_step()

        def before_run(self, run_context):
            if self._tensor is None or not _due_now(period_s):
                return None
            return run_args(self._tensor)

        def after_run(self, run_context, run_values):
            if run_values.results is not None:
                report_global_step(int(run_values.results))

        def end(self, session):
            if self._tensor is not None:
                report_global_step(int(session.run(self._tensor)))

    return GlobalStep


def _with_hook(original, make_hook):
    def init(self, session_creator, hooks, *args, **kwargs):
        try:
            hooks = [*(hooks or []), make_hook()]
        except Exception:  # noqa: BLE001 - a layout we do not know: the session as it is
            pass
        return original(self, session_creator, hooks, *args, **kwargs)

    return init


def _read(session, run, training_util: ModuleType, options) -> None:
    """Read `session`'s global step with the unwrapped `run`; report it."""
    global _due
    began = time.monotonic()
    try:
        tensor = training_util.get_global_step(session.graph)
        if tensor is None or not _initialized(session, run, tensor, options):
            return
        step = int(run(session, tensor, options=options))
    except Exception:  # noqa: BLE001 - not initialized, closed, unreachable: no report
        if time.monotonic() - began > _SLOW_READ_S:  # it cost the script: seldom
            _due = time.monotonic() + _SLOW_BACKOFF_S
        return
    setattr(session, _READ_MARK, True)
    report_global_step(step)


def _initialized(session, run, tensor, options) -> bool:
    """Is the global step initialized (asked until a read succeeded)? A read of
    one that is not fails, and TensorFlow logs it on the ps and the worker
    (`Could not find variable global_step`): a worker waiting for the chief's
    init would print them at each start. A ResourceVariable's own check op."""
    check = getattr(tensor, "_is_initialized_op", None)
    return getattr(session, _READ_MARK, False) or check is None \
        or bool(run(session, check, options=options))


def _reading(unwrapped, training_util: ModuleType, options, period_s: float):
    """`BaseSession.run` and `close` wrappers: the global step read when due
    (with `unwrapped`, the original `run`)."""
    def wrap_run(original):
        def run(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if time.monotonic() >= _due and _due_now(period_s):
                _read(self, original, training_util, options)
            return result

        return run

    def wrap_close(original):
        def close(self, *args, **kwargs):
            if getattr(self, _READ_MARK, False):  # the last steps, once
                _read(self, unwrapped, training_util, options)
            return original(self, *args, **kwargs)

        return close

    return wrap_run, wrap_close


def on_tensorflow(module: ModuleType) -> None:
    from . import hooks, steps

    manager = sys.modules.get("tensorflow.python.training.session_manager")
    if manager is not None:
        hooks.wrap_method(manager.SessionManager, "prepare_session", _preparing, _MARK)
        hooks.wrap_method(manager.SessionManager, "wait_for_session", _forming, _MARK)
        hooks.wrap_method(manager.SessionManager, "_restore_checkpoint", _restoring, _MARK)
    period_s = steps.every_s()
    monitored = sys.modules.get("tensorflow.python.training.monitored_session")
    run_hook = sys.modules.get("tensorflow.python.training.session_run_hook")
    training_util = sys.modules.get("tensorflow.python.training.training_util")
    if period_s <= 0 or None in (monitored, run_hook, training_util):
        return
    hook = _step_hook(run_hook.SessionRunHook, run_hook.SessionRunArgs, training_util, period_s)
    hooks.wrap_method(monitored._MonitoredSession, "__init__",
                      lambda original: _with_hook(original, hook), _STEP_MARK)
    client = sys.modules.get("tensorflow.python.client.session")
    config = sys.modules.get("tensorflow.core.protobuf.config_pb2")
    if client is None or config is None:
        return
    options = config.RunOptions(timeout_in_ms=_READ_TIMEOUT_MS)
    wrap_run, wrap_close = _reading(client.BaseSession.__dict__.get("run"), training_util,
                                    options, period_s)
    hooks.wrap_method(client.BaseSession, "run", wrap_run, _STEP_MARK)
    hooks.wrap_method(client.BaseSession, "close", wrap_close, _STEP_MARK)


HOOKS = {"tensorflow": on_tensorflow}
