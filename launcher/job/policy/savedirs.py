"""The directories the job saved to, in every later generation's plan.

A restore passes over a damaged checkpoint; only in a directory that is the
job's does the chief move its files aside and rewrite the state file
(runtime/jobdirs.py): a warm start's directory, or one shared with other
jobs, is only read. The directories of the saves the tasks reported
(job/detect/resumes.py keeps them) go to every task of the next generation as
one variable, MGPU_SAVE_DIRS (os.pathsep between them: the host's Python
splits it; the newest 32 saved to, `resumes.SAVE_DIRS_KEPT`); set, empty, in
the first generation, so that every task of the job follows the rule.

Pure functions over the plan; no I/O.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ...spec.plan import Plan

SAVE_DIRS_ENV = "MGPU_SAVE_DIRS"  # runtime/jobdirs.py's ENV


def with_save_dirs(plan: Plan, directories: Sequence[str]) -> Plan:
    """`plan` with every task told the directories the job saved to so far."""
    usable = [d for d in directories if d and "://" not in d and not d.startswith("…")
              and os.pathsep not in d]
    value = os.pathsep.join(usable)
    return plan.with_task_env({SAVE_DIRS_ENV: value})
