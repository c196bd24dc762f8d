"""What a stop (Ctrl-C, SIGTERM, `mgpu-launch stop`) did to the tasks, in words.

A stop sends every task SIGTERM and, after `restart.grace_s`, SIGKILL. A task
saves at that moment only if its script does: `runtime.callbacks(
save_on_sigterm=True)` (TensorFlow's PreemptionCheckpointHandler, tf_keras
under MultiWorkerMirroredStrategy: it saves and exits 42) or a SIGTERM handler
of its own. By default neither is there, and a task is killed by SIGTERM, or
by SIGKILL once the grace is over (TensorFlow's threads can keep a dying
process busy): it does not save, and the next run resumes from the last
checkpoint. `entry` turns the tasks' final states into the summary's `stop`
entry, whose `said` is also printed, so no one reads "tasks get 3 s to save"
and then finds every task SIGKILLed.

Pure: reads a RunResult. Imports nothing but job modules.
"""

from __future__ import annotations

import signal
from typing import Any

from ..record.classify import RESTART_ME_EXIT, signal_name
from ..record.states import RunResult

# How to make saves at a stop work: the stop message and the summary say it.
HOW_TO_SAVE = ("a script saves at a stop only with `runtime.callbacks(save_on_sigterm=True)` "
               "(tf_keras under MultiWorkerMirroredStrategy: it saves, then exits 42) or a "
               "SIGTERM handler of its own; `restart.grace_s` is the time it gets")


def entry(result: RunResult, grace_s: float) -> dict[str, Any] | None:
    """The summary's `stop` entry of an interrupted run; None otherwise."""
    if result.status != "interrupted":
        return None
    saved, exited, unsaved = [], [], []
    for label, task in sorted(result.tasks.items()):
        code, signum = task.get("exit_code"), task.get("signal")
        if code == RESTART_ME_EXIT:
            saved.append(label)
        elif signum is not None or (isinstance(code, int) and code >= 128):
            unsaved.append({"task": label, "signal": signal_name(signum or code - 128)})
        elif code is not None:
            exited.append(label)
    if unsaved:
        shown = ", ".join(f"{u['task']} {u['signal']}" for u in unsaved)
        killed = (f" (SIGKILL: still running after the {grace_s:g} s grace)"
                  if any(u["signal"] == signal.SIGKILL.name for u in unsaved) else "")
        said = (f"{len(unsaved)} task(s) did not save, ended by a signal{killed}: {shown}; "
                f"the next run resumes from the last checkpoint. To save at a stop: "
                f"{HOW_TO_SAVE}")
    elif saved and not exited:
        said = (f"every task saved on SIGTERM (exit {RESTART_ME_EXIT}): the next run resumes "
                "from that step")
    elif exited or saved:
        said = (f"the tasks exited by themselves within the {grace_s:g} s grace"
                + (f" ({len(saved)} saved, exit {RESTART_ME_EXIT})" if saved else ""))
    else:
        return None  # stopped before any task started
    return {"signal": signal_name(result.interrupted_by) if result.interrupted_by else None,
            "grace_s": grace_s, "saved": saved, "exited": exited, "did_not_save": unsaved,
            "said": said, "how_to_save": HOW_TO_SAVE}
