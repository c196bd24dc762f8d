"""`mgpu-launch status RUN_DIR [--json | --watch]` and the entry of `mgpu-launch logs`:
argv in, a run directory read (launcher/views/records.py), text out, an exit code.

`status` prints `render_status` (or `--json`, or redraws the live table with
`--watch`: launcher/outlets/status_watch.py); `logs` is launcher/commands/logs.py.
Read-only: never writes into the run directory.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..outlets.rundir import RunDirError, load_run
from ..outlets.status_watch import watch
from ..views.records import render_status
from . import exits, usage
from .logs import logs_main


def _status_main(argv: list[str], out: TextIO) -> int:
    parser = usage.Parser(prog="mgpu-launch status",
                          description="Show the state of a run (finished or not).")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--watch", action="store_true",
                        help="redraw the live table until the job ends (a detached or "
                        "remote-started job); exit 0 if it succeeded, else 1")
    args = parser.parse_args(argv)
    if args.watch and args.json:
        parser.error("--watch and --json exclude each other")
    try:
        if args.watch:
            final = watch(Path(args.run_dir), out)
            if final is None:  # Ctrl-C
                return exits.INTERRUPTED
            return exits.OK if final.status == "succeeded" else exits.FAILED
        view = load_run(args.run_dir)
    except RunDirError as exc:
        print(f"mgpu-launch status: {exc}", file=sys.stderr)
        return exits.USAGE
    if args.json:
        out.write(json.dumps(view.to_json(), indent=2, default=str) + "\n")
    else:
        out.write(render_status(view) + "\n")
    return exits.OK


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `status` or `logs` (as dispatched by the CLI)."""
    argv = list(argv)
    if not argv or argv[0] not in ("status", "logs"):
        print("usage: mgpu-launch status RUN_DIR [--json | --watch] | "
              "mgpu-launch logs RUN_DIR [TASK] [-f] [-n N]", file=sys.stderr)
        return exits.USAGE
    try:
        if argv[0] == "status":
            return _status_main(argv[1:], sys.stdout)
        return logs_main(argv[1:], sys.stdout)
    except BrokenPipeError:  # `mgpu-launch logs RUN | head`
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep Python's exit flush quiet
        except OSError:
            pass
        return exits.OK
