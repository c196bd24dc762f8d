"""The command line: `mgpu-launch` and its subcommands, dispatched.

Owns the exit codes' meaning (launcher/commands/exits.py) and the dispatch:
a subcommand's module is imported only when used; anything else is the run
command (launcher/commands/run.py: its argv parsed, the cluster file read,
the job run by launcher/commands/foreground.py):

    0 the job finished   1 the job failed   2 bad configuration or usage
    130 interrupted (SIGINT)   143 terminated (SIGTERM)

The terminal never decides the job's fate: SIGHUP and a closed stdout (EPIPE)
only make the printer stop writing; the job runs on, the run directory gets
everything and the exit code is the job's. `--detach` (launcher/commands/control.py)
runs the same command in the background.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from .commands import control, exits
from .commands.usage import say, silence_fds

# Subcommand -> module with `main(argv) -> int`, imported only when used.
SUBCOMMANDS = {
    "check": "launcher.commands.check",    # check a cluster before a run
    "simulate": "launcher.commands.simulate",  # start simulated SSH hosts on loopback
    "status": "launcher.commands.status",  # read a run directory
    "logs": "launcher.commands.status",
    "export": "launcher.commands.export",  # Slurm / Kubernetes TFJob
    "stop": "launcher.commands.control",   # stop a running (e.g. detached) job
    "report": "launcher.commands.report",  # a run as one self-contained HTML file
    "profile": "launcher.commands.profile",  # trace every task of a running job at once
    "drill": "launcher.commands.drill",    # inject faults: will the script survive them?
}


def main(argv: Sequence[str] | None = None) -> int:
    control.take_detached_run_dir()  # before anything starts: tasks must not inherit it
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # e.g. `mgpu-launch --dry-run ... | head`: nothing left to say
        silence_fds(1)
        return exits.OK


def _main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        try:
            module = importlib.import_module(SUBCOMMANDS[argv[0]])
        except ModuleNotFoundError as exc:
            say(f"mgpu-launch: `{argv[0]}` is not available in this build ({exc})")
            return exits.USAGE
        return module.main(argv)
    from .commands import run

    return run.main(argv)


if __name__ == "__main__":
    sys.exit(main())
