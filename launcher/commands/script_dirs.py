"""The checkpoint directories a training script names, for `mgpu-launch check --script`.

A tutorial-shaped script keeps its checkpoints where it says, not in
`checkpoint.dir`: `BackupAndRestore(backup_dir="/tmp/backup")`,
`ModelCheckpoint("/ckpt/model.keras")`, `tf.train.CheckpointManager(ckpt,
directory="/ckpt")`. Read from the script's syntax tree (it is not run): the
absolute paths written as string literals, or `os.path.join` of literals. A
path computed at run time is not learnt (the launch says a resume behind the
last save once the job runs: docs/fault-tolerance.md).

Pure but for reading the script; imports nothing of the launcher.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

# The call, the keyword and the position of its directory argument, and
# whether the argument is a file path (its folder is the directory).
_SAVERS = {"BackupAndRestore": ("backup_dir", 0, False),
           "ModelCheckpoint": ("filepath", 0, True),
           "CheckpointManager": ("directory", 1, False)}


def checkpoint_dirs(script: str | os.PathLike) -> list[tuple[str, str]]:
    """[(absolute directory, the call that names it)] in `script`, in order, once each."""
    try:
        tree = ast.parse(Path(script).read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return []
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
        if name not in _SAVERS:
            continue
        keyword, position, is_file = _SAVERS[name]
        value = next((k.value for k in node.keywords if k.arg == keyword), None)
        if value is None and len(node.args) > position:
            value = node.args[position]
        path = _literal(value)
        if path and is_file:
            path = os.path.dirname(path)
        if path and os.path.isabs(path):
            found.setdefault(os.path.normpath(path), f"{name} (line {node.lineno})")
    return list(found.items())


def _literal(node: ast.AST | None) -> str | None:
    """A string literal, or `os.path.join` of string literals."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "join":
        parts = [_literal(arg) for arg in node.args]
        if parts and all(p is not None for p in parts):
            return os.path.join(*parts)  # type: ignore[arg-type]
    return None
