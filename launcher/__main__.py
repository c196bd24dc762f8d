"""`python -m launcher` is `mgpu-launch` (whose console script calls `main` here).

This module imports nothing heavy itself, so that Ctrl-C while the launcher's
modules load (pydantic, paramiko, ...: the first second) ends it quietly with
exit 130, as Ctrl-C later does, instead of with a KeyboardInterrupt traceback.
"""

import sys

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as the launcher's own interrupted runs


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
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
