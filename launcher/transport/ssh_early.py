"""A host's agent started ahead of the launch's connect (`SSHTransport.warm`
with the run's folder): the hosts' logins and agents start while the launcher
imports the job's modules and plans, instead of after.

`run` starts it in its own thread (the connection, the agent, its hello) and
then, until the connect takes it, keeps its lease: the agent stops itself when
the launcher says nothing for `--lease` seconds, and nothing else talks to it
before its link exists. `take` hands it over once (or raises what the start
raised), `cancel` drops it (the transport closes its session).

Standard library only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..spec.target import HostTarget
from .link import PING_EVERY_S

KEEP_LEASE_EVERY_S = PING_EVERY_S  # as the link pings, once it has the agent


class EarlyAgent:
    def __init__(self, host: HostTarget, run_dir: str) -> None:
        self.host = host
        self.run_dir = run_dir
        self._cond = threading.Condition()
        self._outcome: Any = None  # what the start gave, or raised
        self._done = False
        self._taken = False
        self._discard: Callable[[Any], None] | None = None  # cancelled: what to do with it

    def run(self, start: Callable[[], Any], gate: threading.Semaphore,
            ping: Callable[[Any], None]) -> None:
        try:
            with gate:
                outcome = start()
        except BaseException as exc:  # noqa: BLE001 - the connect raises it for this host
            outcome = exc
        with self._cond:
            self._outcome, self._done = outcome, True
            self._cond.notify_all()
            if isinstance(outcome, BaseException):
                return
            if self._taken and self._discard is not None:  # cancelled while it started
                self._discard(outcome)
                return
            # Pinged under the lock: `take` waits for a ping under way, so the
            # link's own writes never mix with one.
            while not self._cond.wait_for(lambda: self._taken, KEEP_LEASE_EVERY_S):
                try:
                    ping(outcome)
                except (OSError, EOFError, ValueError):
                    return  # the connection went: the link will see it

    def take(self) -> Any:
        """The started agent (waited for); or what its start raised."""
        with self._cond:
            self._cond.wait_for(lambda: self._done)
            self._taken = True
            self._cond.notify_all()
            outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def cancel(self, discard: Callable[[Any], None] | None = None) -> None:
        """Nobody will take it: stop keeping its lease, and `discard` what was
        started (now, or once started); without it the transport's close or
        abort ends the session it registered."""
        with self._cond:
            self._taken, self._discard = True, discard
            self._cond.notify_all()
            outcome = self._outcome if self._done else None
        if discard is not None and outcome is not None and \
                not isinstance(outcome, BaseException):
            discard(outcome)
