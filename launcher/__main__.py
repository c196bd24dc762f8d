"""`python -m launcher` is `mgpu-launch` (whose console script calls `main` here).

This module imports nothing heavy itself, so that Ctrl-C while the launcher's
modules load (pydantic, paramiko, ...: the first second) ends it quietly with
exit 130, as Ctrl-C later does, instead of with a KeyboardInterrupt traceback
(or not at all: launcher/commands/interrupts.py).
"""

import sys

from .commands import interrupts
from .commands.exits import INTERRUPTED  # standard library only, imports nothing


def main() -> int:
    interrupts.install()  # a Ctrl-C while modules load is never lost
    try:
        from .cli import main as cli_main

        code = cli_main()
    except KeyboardInterrupt:
        try:
            print("mgpu-launch: interrupted", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass
        # Under `python -m`, CPython (3.11, 3.12) dies by SIGINT at exit, whatever
        # code we return, when the interrupt went through a string exec (the
        # dataclasses made while modules load): that marks it "unhandled".
        # A string exec resets the mark; a code object would not.
        exec("")  # noqa: S102
        return INTERRUPTED
    _exit_without_teardown(code)
    return code  # not reached


def _exit_without_teardown(code: int) -> None:
    """Exit as the interpreter does (non-daemon threads joined, atexit handlers
    run, open files flushed) but without its module teardown: after a launch
    to 32 SSH hosts (paramiko's transports, ~130 threads) that took 0.1-0.36 s
    of the command's end, after the job was over (bench/fanout.py)."""
    import atexit
    import gc
    import os
    import threading

    # io's file objects and their subclasses (gzip's, a socket's makefile) all
    # derive from io.IOBase's C base; a check against io.IOBase itself (an ABC)
    # walks its subclasses for each new type: ~40 ms of CPU over the ~50,000
    # objects a 32-host launch leaves, against ~4 ms.
    from _io import _IOBase

    shutdown = getattr(threading, "_shutdown", None)  # what Python's own exit waits for
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # a file left open keeps its last writes, as at any exit
        try:
            if isinstance(obj, _IOBase) and not obj.closed:
                obj.flush()
        except Exception:  # noqa: BLE001, S110 - a broken stream: as at a normal exit
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


if __name__ == "__main__":
    sys.exit(main())
