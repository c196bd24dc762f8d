"""The run directory's layout is named in one module, launcher/spec/rundir.py:
no other launcher-side module spells one of its file names as a string
(`run_dir / "summary.json"`, `run_dir / "logs"`), so a file is renamed or moved
in one place. The shipped side (agent, bootstrap, standby, runtime) cannot
import it and is not scanned. The names themselves are public (docs/operations.md):
they are pinned here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from launcher.spec import rundir

REPO = Path(__file__).resolve().parent.parent
SHIPPED = ("launcher/runtime/", "launcher/bootstrap.py", "launcher/agent/",
           "launcher/standby.py")
FILES = {rundir.CONFIG, rundir.EVENTS, rundir.SUMMARY, rundir.LAUNCHER_PID,
         rundir.LAUNCHER_OUT, rundir.STOP_MARK}
FOLDERS = {rundir.LOGS, rundir.STACKS, rundir.HOSTS}


def test_the_names_are_the_public_ones():
    files = {"config.yaml", "events.jsonl", "summary.json", "launcher.pid", "launcher.out",
             "stop.requested"}
    assert files == FILES
    assert {"logs", "stacks", "hosts"} == FOLDERS
    assert rundir.log_file_name("host0", "worker0") == "host0-worker0.log"


def _spelled(node: ast.AST) -> str | None:
    """A file name of the layout as a string, or a folder's joined to a path."""
    if isinstance(node, ast.Constant) and node.value in FILES:
        return node.value
    if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)
            and isinstance(node.right, ast.Constant) and node.right.value in FOLDERS):
        return node.right.value
    return None


def test_no_other_module_spells_a_run_directory_name():
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(SHIPPED) or rel == "launcher/spec/rundir.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = _spelled(node)
            if name:
                found.append(f"{rel}:{node.lineno}: {name!r}")
    assert not found, "use the names of launcher/spec/rundir.py:\n" + "\n".join(found)
