"""A restore's files from the nearest complete copy, in the training process.

With `checkpoint: {memory: true}` a restarted task reads the checkpoint its
directory names (runtime/memtier.py). From a slot in this host's memory when
one holds that very save; else, while the launcher is placing a copy of it in
this host's memory (`.in-<xfer>/` in the job's memory folder, made by the
agent before the task started: launcher/agent/peercopy.py), the directory is
read at the same time and the first of the two to be complete is used: a copy
relayed through a busy launcher never makes a restore slower than the
directory. At most WAIT_S for the placed copy.

Standard library only (and runtime/memslots); must not import the launcher side.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable

from .memslots import incoming

WAIT_S = 120.0
POLL_S = 0.05


class _Fetch(threading.Thread):
    """The directory's files copied aside, in the background (stopped, and
    what it copied removed, once the placed copy won)."""

    def __init__(self, target: str, names: list[str], aside: str) -> None:
        super().__init__(daemon=True)
        self.target, self.names, self.aside = target, names, aside
        self.error: OSError | None = None
        self.abandoned = False

    def run(self) -> None:
        try:
            os.makedirs(self.aside, mode=0o700, exist_ok=True)
            for name in self.names:
                with open(os.path.join(self.target, name), "rb") as source, \
                        open(os.path.join(self.aside, name), "wb") as sink:
                    while not self.abandoned and (chunk := source.read(2**20)):
                        sink.write(chunk)
        except OSError as exc:
            self.error = exc
        if self.abandoned:
            shutil.rmtree(self.aside, ignore_errors=True)

    def done(self) -> bool:
        return not self.is_alive() and self.error is None


def fill(work: str, target: str, names: list[str], find: Callable[[], str | None],
         root: str, wait_s: float = WAIT_S) -> str | None:
    """Put `names` in `work`: hard links from the slot `find()` returns, else
    copies from `target`. Returns the slot used (None: the directory)."""
    slot = find()
    fetch = None
    if slot is None and incoming(root):
        fetch = _Fetch(target, names, os.path.join(root, ".fetch-" + os.path.basename(work)))
        fetch.start()
        deadline = time.monotonic() + wait_s
        while incoming(root) and fetch.is_alive() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        slot = None if fetch.done() else find()
    if slot is not None:
        if fetch is not None:
            fetch.abandoned = True  # it removes what it copied
        for name in names:
            os.link(os.path.join(slot, name), os.path.join(work, name))
        return slot
    if fetch is not None:
        fetch.join()
        if fetch.error is None:
            for name in names:
                os.replace(os.path.join(fetch.aside, name), os.path.join(work, name))
            shutil.rmtree(fetch.aside, ignore_errors=True)
            return None
        shutil.rmtree(fetch.aside, ignore_errors=True)
    for name in names:
        shutil.copyfile(os.path.join(target, name), os.path.join(work, name))
    return None
