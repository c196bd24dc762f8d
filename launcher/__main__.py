"""`python -m launcher` is `mgpu-launch` (whose console script calls `main` here).

This module imports nothing heavy itself, so that Ctrl-C while the launcher's
modules load (pydantic, paramiko, ...: the first second) ends it quietly with
exit 130, as Ctrl-C later does, instead of with a KeyboardInterrupt traceback.
"""

import sys

from .commands.exits import INTERRUPTED  # standard library only, imports nothing


def main() -> int:
    try:
        from .cli import main as cli_main

        return cli_main()
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


if __name__ == "__main__":
    sys.exit(main())
