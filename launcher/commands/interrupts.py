"""Ctrl-C before a command has its own handlers: never lost.

Python's default SIGINT handler raises KeyboardInterrupt wherever the main
thread is. Raised inside a weakref callback or a `__del__` (importlib's
module-lock callbacks run while the launcher's modules load), the interpreter
prints "Exception ignored in: ..." with a traceback and drops it: the Ctrl-C is
lost and the launch goes on as if it never came (CI saw a job start after it).
So `python -m launcher` installs `install()` first: Ctrl-C still raises
KeyboardInterrupt, and is also remembered; an interrupt the interpreter dropped
is not printed, and the first command handler that owns the process
(launcher/commands/signals.py) acts on it with `take()`.

Standard library only: installed before anything else is imported.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

_dropped: list[int] = []  # interrupts raised where they could not propagate
_raised: list[int] = []  # every early interrupt raised


def install() -> None:
    signal.signal(signal.SIGINT, _remember_and_raise)
    sys.unraisablehook = _drop_interrupts(sys.unraisablehook)


def take() -> int | None:
    """The signal of an early interrupt the interpreter dropped (once), else None."""
    return _dropped.pop(0) if _dropped else None


def _remember_and_raise(signum: int, _frame: Any) -> None:
    _raised.append(signum)
    raise KeyboardInterrupt


def _drop_interrupts(previous):
    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _raised:
            _dropped.append(_raised[-1])
            return
        previous(unraisable)
    return hook
