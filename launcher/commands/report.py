"""`mgpu-launch report RUN_DIR [-o FILE]`: a run told in one self-contained HTML file.

argv in, the run read into a `Report` (launcher/views/report.py) and drawn
(launcher/views/report_html.py), one file written (private: 0600), its path
printed, an exit code.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ..outlets.rundir import RunDirError, load_run
from ..views.report import REPORT, build
from ..views.report_html import render
from . import exits, usage


def _write_private(path: Path, text: str) -> None:
    """Write `path` whole (a reader never sees half a report), readable by the
    user only: it holds what the run's logs hold."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `report` (as dispatched by the CLI)."""
    parser = usage.Parser(prog="mgpu-launch report",
                          description="Write a run (finished or still going) as one "
                          "self-contained HTML file: it opens from disk, no network needed.")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"where to write it (default RUN_DIR/{REPORT})")
    args = parser.parse_args(list(argv)[1:])
    try:
        report = build(load_run(args.run_dir))
    except RunDirError as exc:
        print(f"mgpu-launch report: {exc}", file=sys.stderr)
        return exits.USAGE
    out = Path(args.output) if args.output else Path(args.run_dir) / REPORT
    try:
        _write_private(out, render(report))
    except OSError as exc:
        print(f"mgpu-launch report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return exits.USAGE
    print(out)
    return exits.OK
