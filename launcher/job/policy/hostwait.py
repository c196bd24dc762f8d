"""The hosts of the next generation after a loss, and waiting for a lost host
to come back: reconnection attempts, each in a thread of its own, until the
host answers, the wait ends or a stop comes.

Called from the supervisor thread between generations; tells `HostsChosen`,
`HostWait` and `HostBack` events. Talks to hosts only through the `reconnect` it is given.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from ...transport import AgentLink
from ..detect.generation import Generation
from ..record.events import Event, HostBack, HostsChosen, HostWait
from ..record.phases import Phase
from .recovery import HostInfo, choose_hosts

POLL_S = 0.1


class HostRules(Protocol):  # what of the restart policy a host loss reads
    on_host_loss: str
    min_workers: int
    host_wait_s: float
    backoff_s: float


class HostWaiter:
    def __init__(self, reconnect: Callable[[str], AgentLink] | None,
                 links: dict[str, AgentLink], tell: Callable[[Event], None],
                 wait: Callable[[float], bool], stop_pending: Callable[[], bool],
                 clock: Callable[[], float], hosts: Sequence[HostInfo],
                 policy: HostRules) -> None:
        self._hosts = list(hosts)
        self._policy = policy
        self._reconnect = reconnect
        self._links = links
        self._tell = tell
        self._wait = wait  # sleeps while draining messages; True when a stop came
        self._stop_pending = stop_pending
        self._clock = clock
        self._retry_s = max(1.0, policy.backoff_s)

    def hosts_for_next(self, gen: Generation, active: list[str]) -> list[str] | None:
        """Hosts of the next generation; None when waiting was cut short.
        Raises recovery.NotEnoughHosts when too few workers are left."""
        # Hosts whose link died after their generation ended count as lost too.
        lost = gen.lost_hosts | gen.set_aside | \
            {name for name in active if not self._link_alive(name)}
        if not lost:
            return active
        # So does an idle spare whose agent is gone: no waiting for it in a lost host's place.
        lost |= {h.name for h in self._hosts if h.spare and h.name not in active
                 and not self._link_alive(h.name)}
        choice = choose_hosts(self._hosts, active, lost,
                              self._policy.on_host_loss, self._policy.min_workers)
        self._tell(HostsChosen(hosts=choice.active, lost=tuple(sorted(lost)),
                               message=choice.message))
        # Lost hosts we wait for, and any chosen host whose agent went away.
        reconnect = [n for n in choice.active if n in lost or not self._link_alive(n)]
        for name in reconnect:
            gen.enter(Phase.WAITING_FOR_HOST)
            if not self.wait_for(name, self._policy.host_wait_s):
                return None
        return list(choice.active)

    def _link_alive(self, host: str) -> bool:
        link = self._links.get(host)
        return link is not None and not link.closed

    def wait_for(self, host: str, timeout: float) -> bool:
        """Reconnect to `host` until it answers; False on timeout or interruption."""
        if self._reconnect is None:
            return False
        deadline = self._clock() + timeout
        attempt = 0
        while self._clock() < deadline:
            attempt += 1
            outcome = self._attempt(host)
            if outcome is None:
                return False  # a stop was requested during the attempt
            if isinstance(outcome, AgentLink):
                self._links[host] = outcome
                self._tell(HostBack(host=host, attempts=attempt))
                return True
            if attempt == 1:
                self._tell(HostWait(host=host, timeout_s=timeout, detail=str(outcome)))
            if self._wait(self._retry_s):
                return False
        return False

    def _attempt(self, host: str) -> AgentLink | Exception | None:
        """One reconnection attempt: the new link, why it failed, or None when a
        stop came first. It runs in a thread: an attempt on a cut-off host blocks
        for the whole connect timeout, and Ctrl-C must not wait for that."""
        assert self._reconnect is not None
        reconnect = self._reconnect
        outcome: list[AgentLink | Exception] = []
        done = threading.Event()

        def attempt() -> None:
            try:
                outcome.append(reconnect(host))
            except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=attempt, name=f"reconnect-{host}", daemon=True).start()
        while not done.wait(POLL_S):
            if self._stop_pending():
                threading.Thread(target=_close_late_link, args=(done, outcome),
                                 daemon=True).start()
                return None
        return outcome[0]


def _close_late_link(done: threading.Event, outcome: list) -> None:
    """An abandoned reconnection may still succeed: close what it brings."""
    done.wait()
    if outcome and isinstance(outcome[0], AgentLink):
        outcome[0].close()
