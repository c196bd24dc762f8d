"""The stop signals of a command that runs a launch (the run command, `drill`).

The process's signal handlers are its command's: while a launch runs, SIGINT
(Ctrl-C) and SIGTERM (e.g. `mgpu-launch stop`) only ask it to stop through the
`StopRequest` it was handed (launcher/job/run/sequence.py): while the hosts are
reached that ends the launch as Ctrl-C does; once the job runs, its supervisor
stops every task (SIGTERM, grace, SIGKILL) and the summary is still written.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from ..job.run.sequence import StopRequest
from . import interrupts

STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stops_asked(stop: StopRequest | None = None) -> Iterator[StopRequest]:
    """SIGINT and SIGTERM go to `stop` (a new one if None) until the block ends."""
    request = stop if stop is not None else StopRequest()
    previous = {sig: signal.signal(sig, lambda signum, _frame: request.ask(signum))
                for sig in STOPS}
    dropped = interrupts.take()  # a Ctrl-C the interpreter dropped while loading
    if dropped is not None:
        request.ask(dropped)
    try:
        yield request
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
