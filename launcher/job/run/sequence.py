"""A launch's sequence, in one call: connect -> preflight -> start -> run.

    first = launch.prepare().plan        no host reached yet: the plan the screen
                                         (and `--detach`) need; see launch.py
    stop = StopRequest()                 the caller's signal handlers call stop.ask
    ended = run_launch(launch, first, transport, screen, stop, ...)

`run_launch` is what the run command (in the foreground, and as the background
launcher of `--detach`; `--local` and `--slurm` alike) and every job of
`mgpu-launch drill` call. It returns an `Outcome` (the job ran, its summary is
written) or an `EarlyEnd` (it ended before its job started: a host not reached,
a refusal, a stop): values, never text to print nor exit codes. A stop asked
for from outside comes in as the `StopRequest` the caller hands in; this module
installs no signal handler (only the command that owns the process does).

Must not import: views, commands, cli.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...spec.addresses import AddressError
from ...spec.plan import Plan
from ...transport import Transport, TransportError
from .launch import Job, Launch, Outcome, Screen, View


class StopRequest:
    """Stops asked for from outside a launch (Ctrl-C, SIGTERM, `mgpu-launch
    stop`), for whoever runs it now. `ask` is safe from a signal handler: while
    the hosts are reached it interrupts the wait (KeyboardInterrupt, as Ctrl-C
    does), then it is kept until the job exists, and from then on it is handed
    to the job's supervisor, which stops every task."""

    def __init__(self) -> None:
        self.signals: list[int] = []  # every stop asked for, in order
        self._job: Job | None = None
        self._told = 0  # how many of `signals` the job was told
        self._interrupts = False

    @property
    def first(self) -> int | None:
        return self.signals[0] if self.signals else None

    def ask(self, signum: int) -> None:
        self.signals.append(signum)
        if self._interrupts:
            raise KeyboardInterrupt(signum)
        self._hand_on()

    def interrupts(self, on: bool) -> None:
        """While on, a stop interrupts what runs (a connect that may block)."""
        self._interrupts = on

    def attach(self, job: Job | None) -> None:
        """Hand the stops to `job` (those asked before it existed first); None: to nobody."""
        self._job = job
        self._hand_on()

    def _hand_on(self) -> None:
        job = self._job
        while job is not None and self._told < len(self.signals):
            signum = self.signals[self._told]
            self._told += 1
            job.request_stop(signum)


@dataclass(frozen=True)
class EarlyEnd:
    """A launch that ended before its job started (nothing left connected).

    `why`: "unreachable" (a host not reached, an address not found: `reasons`
    holds the error), "refused" (the job's firewall cannot be set up on a host:
    `reasons` holds each refusal, `notices` what preflight noted too) or
    "interrupted" (a stop while the hosts were reached: `signum`)."""

    why: str
    reasons: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()
    signum: int | None = None


def run_launch(launch: Launch, first: Plan, transport: Transport, screen: Screen,
               stop: StopRequest, *, max_restarts: int | None = None,
               views: Sequence[View] = (),
               started: Callable[[Job], None] | None = None) -> Outcome | EarlyEnd:
    """Reach every host (`first`, from `launch.prepare`), check the firewall,
    start the job and supervise it to its outcome. The preflight's notices go to
    `screen` before the job starts; `started(job)` is called once the job exists,
    before it runs (the caller's notice, the drill's injector)."""
    if stop.first is not None:  # asked before any host was reached
        return EarlyEnd("interrupted", signum=stop.first)
    stop.interrupts(True)
    try:
        connected = launch.connect(transport, first)
    except (TransportError, AddressError) as exc:
        return EarlyEnd("unreachable", reasons=(str(exc),))
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        return EarlyEnd("interrupted", signum=signum)
    finally:
        stop.interrupts(False)
    refusals, notices = launch.preflight(connected)
    if refusals:
        connected.close()
        return EarlyEnd("refused", reasons=tuple(refusals), notices=tuple(notices))
    for line in notices:
        screen.notice(line)
    job = launch.start(connected, screen, max_restarts, views)
    if started is not None:
        started(job)
    stop.attach(job)
    try:
        return job.run()
    finally:
        stop.attach(None)
