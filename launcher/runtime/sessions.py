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
- adds to every `MonitoredSession` (hence `MonitoredTrainingSession`) one
  `SessionRunHook` that fetches the global step with the script's own
  `run`, at most once every `MGPU_STEPS_EVERY_S` seconds (default 2; 0: off),
  never a `run` of its own but one at the session's end (the last steps), and
  reports it as the step counter does (`counted`). A script that reports its
  own steps wins, as there.

Standard library only at import time; TensorFlow is reached through the modules
its import loaded. Must not import the launcher side.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType

_MARK = "_mgpu_forms_sessions"
_STEP_MARK = "_mgpu_counts_global_steps"
_last_reported: int | None = None


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


def report_global_step(step: int | None) -> None:
    """The global step read, reported when it moved (the counter's way)."""
    global _last_reported
    from launcher import runtime

    if step is None or step <= 0 or step == _last_reported \
            or runtime.steps_reported_by_script():
        return
    _last_reported = step
    _report({"step": int(step), "time": time.time(), "counted": 1})


def _step_hook(hook_base: type, run_args: type, training_util: ModuleType, period_s: float):
    """A SessionRunHook class (of the script's TensorFlow) that fetches the
    global step with the script's `run` at most once every `period_s`."""

    class GlobalStep(hook_base):
        def begin(self):
            self._tensor = training_util.get_global_step()
            self._due = 0.0

        def before_run(self, run_context):
            now = time.monotonic()
            if self._tensor is None or now < self._due:
                return None
            self._due = now + period_s
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


def on_tensorflow(module: ModuleType) -> None:
    from . import hooks, steps

    manager = sys.modules.get("tensorflow.python.training.session_manager")
    if manager is not None:
        for name in ("prepare_session", "wait_for_session"):
            hooks.wrap_method(manager.SessionManager, name, _forming, _MARK)
    period_s = steps.every_s()
    monitored = sys.modules.get("tensorflow.python.training.monitored_session")
    run_hook = sys.modules.get("tensorflow.python.training.session_run_hook")
    training_util = sys.modules.get("tensorflow.python.training.training_util")
    if period_s <= 0 or None in (monitored, run_hook, training_util):
        return
    hook = _step_hook(run_hook.SessionRunHook, run_hook.SessionRunArgs, training_util, period_s)
    hooks.wrap_method(monitored._MonitoredSession, "__init__",
                      lambda original: _with_hook(original, hook), _STEP_MARK)


HOOKS = {"tensorflow": on_tensorflow}
