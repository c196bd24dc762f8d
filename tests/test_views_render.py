"""Views render; I/O has its floor (docs/design.md, "Packages in flow order").

Every module of launcher/views/ is read with `ast`: none imports a module
that reaches outside the process (files, processes, sockets, psutil), and
none calls a function that reads or writes a file or a stream. The reading
is launcher/outlets/rundir.py's (a run directory's files, read once); the
writing, outlets/printer.py's and outlets/screen.py's.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VIEWS = REPO / "launcher" / "views"

# Modules whose use is I/O (a lock, a clock, the environment's NO_COLOR are not).
IO_MODULES = {"subprocess", "socket", "psutil", "http", "urllib", "select", "shutil",
              "selectors", "asyncio", "io", "tempfile", "glob", "yaml"}
# Calls that touch a file or a stream, by name or method name.
IO_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "exists",
            "is_file", "is_dir", "stat", "lstat", "listdir", "scandir", "iterdir", "walk",
            "glob", "unlink", "mkdir", "rename", "write", "flush", "fileno",
            "get_terminal_size", "isatty", "kill", "system", "popen"}


def io_in(source: str) -> list[str]:
    """Each I/O import or call in `source`, with its line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        found += [f"line {node.lineno}: import {n}" for n in names
                  if n.split(".")[0] in IO_MODULES]
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in IO_CALLS:
                found.append(f"line {node.lineno}: {ast.unparse(func)}()")
    return found


def test_no_view_reads_or_writes_outside_the_process():
    found = {path.name: io_in(path.read_text()) for path in sorted(VIEWS.glob("*.py"))}
    found = {name: calls for name, calls in found.items() if calls}
    assert not found, ("views render what they are given; their I/O goes to "
                       f"launcher/outlets/ (rundir, printer, screen): {found}")


def test_the_check_finds_io():
    source = ("import subprocess\nfrom pathlib import Path\n"
              "def f(p: Path, s):\n    s.write(p.read_text())\n    return p.exists()\n")
    assert sorted(io_in(source)) == ["line 1: import subprocess", "line 4: p.read_text()",
                                     "line 4: s.write()", "line 5: p.exists()"]


def test_a_per_task_field_reaches_every_task_view_from_one_file(monkeypatch, tmp_path):
    """The walk of docs/design.md: a new per-task field is its event's field,
    its fold, and its cells in views/taskcells.py. A cell added there alone
    shows in `status`, `status --json`, the report's task table and the live
    table (the launcher's and `status --watch`'s)."""
    from launcher.job.record.story import fold
    from launcher.spec.rundir import RunFiles
    from launcher.views import live, records, report_html, taskcells
    from launcher.views.report import build

    cell = taskcells.Cell
    monkeypatch.setattr(taskcells, "STATUS", (*taskcells.STATUS,
                                              cell("HOST", lambda tw: f"<{tw[0].host}>")))
    monkeypatch.setattr(taskcells, "JSON", (*taskcells.JSON, cell("on", lambda t: t.host)))
    monkeypatch.setattr(taskcells, "REPORT", (*taskcells.REPORT,
                                              cell("placed on", lambda t: f"[{t.host}]")))
    monkeypatch.setattr(taskcells, "LIVE", (*taskcells.LIVE, cell("GEN", lambda r: "g7")))
    events = [{"v": 2, "t": 1.0, "event": "launch", "generation": 0,
               "tasks": [{"task": "worker0", "host": "host0"}]},
              {"v": 2, "t": 2.0, "event": "task_started", "generation": 0, "task": "worker0",
               "host": "host0", "pid": 7},
              {"v": 2, "t": 3.0, "event": "progress", "generation": 0, "task": "worker0",
               "host": "host0", "step": 5}]
    files = RunFiles(run_dir=tmp_path, config={"name": "walk"}, events=events, summary=None,
                     detached=None, launcher_alive=True)
    view = records.run_view(files, now=4.0)
    status = records.render_status(view, now=4.0)
    assert "HOST" in status and "<host0>" in status, status
    assert view.to_json()["tasks"][0]["on"] == "host0"
    page = report_html.render(build(view, now=4.0))
    assert "placed on" in page and "[host0]" in page
    table = "\n".join(live.render(fold(events).rows(4.0), width=200, height=20, elapsed_s=3.0,
                                  colour=False))
    assert "GEN" in table and "g7" in table, table


def test_a_summary_json_that_cannot_be_read_is_still_named(tmp_path):
    """A torn summary.json (the launcher killed while writing it): `status`
    still names the file, as it did before the one reader read the files."""
    from launcher.spec.rundir import RunFiles
    from launcher.views import records

    files = RunFiles(run_dir=tmp_path, config={}, events=[], summary=None, detached=None,
                     launcher_alive=False, summary_written=True)
    text = records.render_status(records.run_view(files, now=0.0), now=0.0)
    assert f"summary:    {tmp_path / 'summary.json'}" in text, text
