"""Restart policy: whether to start another generation, and on which hosts.

Pure decisions over plain values, so the policy can be tested by replaying
histories. The supervisor gathers the facts (what failed, whether the
checkpoint advanced, which hosts are gone) and follows the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..detect.sentinel import BatchSkip
from ..record.classify import NO_READABLE_CHECKPOINT


@dataclass(frozen=True)
class HostInfo:
    name: str
    workers: int  # chief + worker tasks it runs when active
    spare: bool


@dataclass(frozen=True)
class HostChoice:
    active: tuple[str, ...]  # hosts of the next generation, in YAML order
    message: str  # what changed, for the user ("" when nothing did)


class NotEnoughHosts(Exception):
    pass


def choose_hosts(hosts: Sequence[HostInfo], active: Sequence[str], lost: set[str],
                 on_host_loss: str, min_workers: int) -> HostChoice:
    """Hosts for the next generation after `lost` went away.

    A lost host is replaced by an idle spare first; without one, `wait` waits
    for it to come back and `shrink` carries on without it, as long as at
    least `min_workers` workers remain.
    """
    by_name = {h.name: h for h in hosts}
    keep = [name for name in active if name not in lost]
    spares = [h.name for h in hosts if h.spare and h.name not in active and h.name not in lost]
    replaced, missing = [], []
    for name in (n for n in active if n in lost):
        if spares:
            spare = spares.pop(0)
            keep.append(spare)
            replaced.append(f"{spare} replaces {name}")
        else:
            missing.append(name)
    order = {h.name: i for i, h in enumerate(hosts)}
    message = "; ".join(replaced)
    if missing and on_host_loss == "wait":
        chosen = sorted(keep + missing, key=order.__getitem__)
        note = f"waiting for {', '.join(missing)} to come back"
        return HostChoice(tuple(chosen), "; ".join(filter(None, [message, note])))
    workers = sum(by_name[name].workers for name in keep)
    if missing and workers < min_workers:
        raise NotEnoughHosts(
            f"lost {', '.join(missing)}: {workers} worker(s) left, fewer than "
            f"restart.min_workers={min_workers}")
    if missing:
        message = "; ".join(filter(None, [message, f"continuing without {', '.join(missing)} "
                                           f"({workers} worker(s) left)"]))
    return HostChoice(tuple(sorted(keep, key=order.__getitem__)), message)


# Restarts that neither advanced the checkpoint nor counted (a task exiting 42
# again and again without saving anything) are free, but not endless.
MAX_FREE_RESTARTS_IN_A_ROW = 10
# The backoff goes back to `backoff_s` after a generation that made progress
# for at least this long: its failure was no loop, whatever came before it.
BACKOFF_RESET_S = 60.0

# Which rule ended the job (summary.json `stopped_by`).
STOPPED_BY_NO_RESTARTS = "no_restarts"
STOPPED_BY_MAX_RESTARTS = "max_restarts"
STOPPED_BY_MAX_TOTAL = "max_total_restarts"
STOPPED_BY_DETERMINISTIC = "deterministic"
STOPPED_BY_PREEMPTION_LOOP = "preemption_loop"
STOPPED_BY_NONFINITE = "nonfinite"
# What a failure whose restore found no checkpoint it could read is said as
# (classify.script_mistake; runtime/readable.py's NoReadableCheckpoint).


@dataclass(frozen=True)
class Budget:
    """What restarts have cost so far.

    `spent` counts every restart after which the training had not moved (not
    only consecutive ones: a job that alternates progress and crash loops still
    ends). `total` counts every restart, against the absolute cap.
    `free_in_a_row` counts preemptions without progress since the last
    progress, so a task that exits 42 forever is stopped too.
    """

    max_restarts: int
    max_total: int = 100
    spent: int = 0
    total: int = 0
    free_in_a_row: int = 0

    def after(self, counts: bool, advanced: bool = False) -> Budget:
        free = 0 if advanced or counts else self.free_in_a_row + 1
        return Budget(self.max_restarts, self.max_total, self.spent + (1 if counts else 0),
                      self.total + 1, free)

    def refund(self) -> Budget:
        """The last counted restart did move the training after all (the next
        generation resumed past the previous one): it does not count."""
        return Budget(self.max_restarts, self.max_total, max(0, self.spent - 1), self.total, 0)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.max_restarts


def restart_counts(advanced: bool, preempted: bool) -> bool:
    """A restart counts against `max_restarts` only when the failed generation
    neither advanced the checkpoint nor was preempted (a task exited 42: it
    saved and asks to be restarted)."""
    return not (advanced or preempted)


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    counts: bool  # against restart.max_restarts
    budget: Budget  # after this restart (unchanged when giving up)
    message: str  # why the launcher gives up ("" when it restarts, or for max_restarts 0)
    stopped_by: str = ""  # the rule that ended the job ("" when it restarts)


def decide_restart(budget: Budget, advanced: bool, preempted: bool,
                   repeated: str = "", mistake: str = "", free: bool = False,
                   again: str = "", skip: BatchSkip | None = None) -> RestartDecision:
    """Start another generation after a failed one?

    `advanced`: the checkpointed training step moved during the failed
    generation. `repeated`: set (to the failure's description) when the
    failure is the previous generation's again (same exception, same
    innermost frame) with no progress in between: deterministic, so another
    try would only fail the same way. `max_restarts: 0` means never restart,
    not even after a preemption. `mistake`: set (to what is wrong) when the
    failure is a mistake in the script itself (classify.script_mistake: a
    syntax error, a failed import of its own, the script missing), or a
    restore that found no readable checkpoint (NO_READABLE_CHECKPOINT): it would
    fail the same way on every try, so the first occurrence ends the job.
    `free`: a failure that is not the script's bug, free the first time (the NaN
    sentinel's first stop in a job); `again`: set (to why) when the same step's
    loss went non-finite twice in a row (job/detect/sentinel.py): the job ends;
    `skip`: instead, the next generation skips that step's batch: free too.
    """
    counts = restart_counts(advanced, preempted) and not (free or skip is not None)
    if budget.max_restarts == 0:
        return RestartDecision(False, counts, budget, "", STOPPED_BY_NO_RESTARTS)
    if again:
        return RestartDecision(False, counts, budget, f"gave up: {again}", STOPPED_BY_NONFINITE)
    if mistake and not preempted:
        fix = ("no restart would find one: put a readable checkpoint there, or move these "
               "aside to start from step 0" if mistake.startswith(NO_READABLE_CHECKPOINT) else
               "a mistake in the script fails the same way on every try: fix it and launch again")
        return RestartDecision(False, counts, budget, (
            f"gave up at the first failure, not restarted: {mistake}; {fix}"),
            STOPPED_BY_DETERMINISTIC)
    if repeated and not advanced and not preempted:
        return RestartDecision(False, counts, budget, (
            f"gave up: the same failure twice in a row without progress ({repeated}): it is "
            "deterministic, another restart would fail the same way; fix it and launch "
            "again (the checkpoint is kept)"), STOPPED_BY_DETERMINISTIC)
    if budget.total >= budget.max_total:
        return RestartDecision(False, counts, budget, (
            f"gave up: {budget.total} restarts in all (restart.max_total_restarts="
            f"{budget.max_total})"), STOPPED_BY_MAX_TOTAL)
    if counts and budget.exhausted:
        return RestartDecision(False, counts, budget, (
            f"gave up: {budget.spent + 1} failures without progress (restart.max_restarts="
            f"{budget.max_restarts}; the checkpointed step did not advance in between): "
            "a crash loop"), STOPPED_BY_MAX_RESTARTS)
    following = budget.after(counts, advanced)
    if following.free_in_a_row > MAX_FREE_RESTARTS_IN_A_ROW:
        return RestartDecision(False, counts, budget, (
            f"gave up: {following.free_in_a_row} preemptions (exit 42) in a row without "
            "progress (the checkpoint did not advance): a task asks to be restarted "
            "without saving anything"), STOPPED_BY_PREEMPTION_LOOP)
    return RestartDecision(True, counts, following, "")


def backoff_delay(attempt: int, base_s: float, cap_s: float) -> float:
    """Seconds to wait before restart number `attempt` (0-based) since the last
    reset: `base_s`, doubling each time, never above `cap_s`."""
    if base_s <= 0:
        return 0.0
    return min(cap_s, base_s * 2 ** min(attempt, 62))


