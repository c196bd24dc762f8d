"""`python -S -m launcher.agent ...`: the agent's process (launcher/agent/main.py)."""

import os
import sys

from launcher.agent.main import main


def run() -> None:
    """The agent's life, then its exit. The SSH transport's command calls this
    (no runpy: its importlib.util and contextlib cost ~3 ms of every host's start)."""
    code = main()
    # Without the interpreter's teardown: its tasks are reaped and its `bye`
    # written, and every thread left is a daemon. The teardown cost ~15 ms of
    # CPU per host at a job's end, all hosts at once (bench/fanout.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # run by -m as __main__; a plain import does nothing
    run()
