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
