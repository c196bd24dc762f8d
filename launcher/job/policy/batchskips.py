"""The bad batches a job skips, in every later generation's plan.

When the same step's loss went non-finite again after the restart from the
save before it, and its task said its input's position is exact, the NaN
sentinel skips that step's batch (job/detect/sentinel.py `judged`). The job's
list of them goes to every task of every later generation as one variable,
MGPU_SKIP_BATCHES="epoch:batch:step,..." (epoch and batch from 0, as the
`nonfinite` report numbers them; the step it went bad at), which the task's
tf_keras `fit` reads at each epoch (runtime/epochinput.py: the batch read and
dropped at its position, where the step about to train it is that step: not
in another `fit` of the script).

Pure functions over the plan; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...spec.plan import Plan
from ..detect.sentinel import BatchSkip

SKIP_ENV = "MGPU_SKIP_BATCHES"  # runtime/epochinput.py's SKIP_ENV


def skip_value(skipped: Sequence[BatchSkip]) -> str:
    """The variable's value: "epoch:batch:step" of each, in the order skipped."""
    return ",".join(f"{s.epoch}:{s.batch}:{s.step}" for s in skipped)


def with_skips(plan: Plan, skipped: Sequence[BatchSkip]) -> Plan:
    """`plan` with every task told the batches to skip (itself when none)."""
    if not skipped:
        return plan
    value = skip_value(skipped)
    return plan.with_task_env({SKIP_ENV: value})
