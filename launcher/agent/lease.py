"""The lease: the launcher's silence, and the agent's exit when it lasts.

`--lease SECONDS` (0 = none): when nothing at all arrives on stdin for that
long (the launcher pings every second), the launcher is taken for gone (a
network partition closes no pipe): the agent stops every task as on EOF and
exits with EXIT_LEASE.

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import os
import threading
import time

EXIT_LEASE = 3  # the agent's exit code when its lease ran out
LEASE_CHECK_S = 0.2


class Lease:
    def __init__(self, emit) -> None:
        self.emit = emit
        self.last_heard = time.monotonic()  # anything at all on stdin

    def heard(self) -> None:
        self.last_heard = time.monotonic()

    def watch(self, lease_s: float, shutdown) -> None:
        """Call `shutdown()` and exit when the launcher has said nothing for `lease_s`."""
        while True:
            silent = time.monotonic() - self.last_heard
            if silent > lease_s:
                break
            time.sleep(min(LEASE_CHECK_S, lease_s - silent + 0.01))
        why = (f"nothing from the launcher for {silent:.1f} s (lease {lease_s:g} s): "
               "stopping every task and exiting")
        # The way back may be as dead as the way in, and a write to it may block
        # forever: tell it on the side, stop the tasks first, exit in any case.
        threading.Thread(target=self.emit, args=("log",), kwargs={"text": why},
                         daemon=True).start()
        shutdown()
        goodbye = threading.Thread(target=self.emit, args=("bye",),
                                   kwargs={"reason": "lease"}, daemon=True)
        goodbye.start()
        goodbye.join(timeout=1.0)
        os._exit(EXIT_LEASE)
