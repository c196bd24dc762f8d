"""Restart policy: whether to start another generation, and on which hosts.

Pure decisions over plain values, so the policy can be tested by replaying
histories. The supervisor gathers the facts (what failed, whether the
checkpoint advanced, which hosts are gone) and follows the decision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class HostInfo:
    name: str
    workers: int  # chief + worker tasks it runs when active
    spare: bool


@dataclass(frozen=True)
class HostChoice:
    active: tuple[str, ...]  # hosts of the next generation, in YAML order
    wait_for: tuple[str, ...]  # lost hosts to wait for before starting
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
        return HostChoice(tuple(chosen), tuple(missing), "; ".join(filter(None, [message, note])))
    workers = sum(by_name[name].workers for name in keep)
    if missing and workers < min_workers:
        raise NotEnoughHosts(
            f"lost {', '.join(missing)}: {workers} worker(s) left, fewer than "
            f"restart.min_workers={min_workers}")
    if missing:
        message = "; ".join(filter(None, [message, f"continuing without {', '.join(missing)} "
                                           f"({workers} worker(s) left)"]))
    return HostChoice(tuple(sorted(keep, key=order.__getitem__)), (), message)


# Restarts that neither advanced the checkpoint nor counted (a task exiting 42
# again and again without saving anything) are free, but not endless.
MAX_FREE_RESTARTS_IN_A_ROW = 10


@dataclass(frozen=True)
class Budget:
    """Restarts spent without progress; progress (or a preemption) is free.

    `spent` counts every restart after which the checkpoint had not advanced
    (not only consecutive ones: a job that alternates progress and crash
    loops still ends). `free_in_a_row` counts preemptions without progress
    since the last progress, so a task that exits 42 forever is stopped too.
    """

    max_restarts: int
    spent: int = 0
    free_in_a_row: int = 0

    def after(self, counts: bool, advanced: bool = False) -> Budget:
        free = 0 if advanced or counts else self.free_in_a_row + 1
        return Budget(self.max_restarts, self.spent + (1 if counts else 0), free)

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.max_restarts


def restart_counts(advanced: bool, preempted: bool) -> bool:
    """A restart counts against the budget only when the failed generation
    neither advanced the checkpoint nor was preempted (exit 42, SIGTERM)."""
    return not (advanced or preempted)


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    counts: bool  # against restart.max_restarts
    budget: Budget  # after this restart (unchanged when giving up)
    message: str  # why the launcher gives up ("" when it restarts, or for max_restarts 0)


def decide_restart(budget: Budget, advanced: bool, preempted: bool) -> RestartDecision:
    """Start another generation after a failed one?

    `max_restarts: 0` means never restart, not even after a preemption.
    """
    counts = restart_counts(advanced, preempted)
    if budget.max_restarts == 0:
        return RestartDecision(False, counts, budget, "")
    if counts and budget.exhausted:
        return RestartDecision(False, counts, budget, (
            f"gave up: {budget.spent + 1} failures without progress (restart.max_restarts="
            f"{budget.max_restarts}; the checkpoint did not advance in between): a crash loop"))
    following = budget.after(counts, advanced)
    if following.free_in_a_row > MAX_FREE_RESTARTS_IN_A_ROW:
        return RestartDecision(False, counts, budget, (
            f"gave up: {following.free_in_a_row} preemptions (exit 42) in a row without "
            "progress (the checkpoint did not advance): a task asks to be restarted "
            "without saving anything"))
    return RestartDecision(True, counts, following, "")
