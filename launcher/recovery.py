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


@dataclass(frozen=True)
class Budget:
    """Restarts spent without progress; progress (or a preemption) is free."""

    max_restarts: int
    spent: int = 0

    def after(self, counts: bool) -> Budget:
        return Budget(self.max_restarts, self.spent + (1 if counts else 0))

    @property
    def exhausted(self) -> bool:
        return self.spent >= self.max_restarts


def restart_counts(advanced: bool, preempted: bool) -> bool:
    """A restart counts against the budget only when the failed generation
    neither advanced the checkpoint nor was preempted (exit 42, SIGTERM)."""
    return not (advanced or preempted)
