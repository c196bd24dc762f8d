"""The agent's files in the host's run directory: private folders and files.

TF_CONFIG, error reports, stacks and pid records live there: every folder the
agent makes is 0700 and every file 0600, whatever the umask. Standard library
only; imports nothing of the launcher.
"""

from __future__ import annotations

import json
import os


def makedirs_private(path: str) -> None:
    """Create `path` and every missing parent with mode 0700 (os.makedirs
    applies the mode to the last folder only)."""
    missing = []
    current = path
    while current and not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass


def private_dir(run_dir: str, *parts: str) -> str:
    """`run_dir/parts...`, made (0700) if missing."""
    path = os.path.join(run_dir, *parts)
    makedirs_private(path)
    return path


def write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # the file may predate us with wider bits
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def file_size(path: str | None) -> int:
    try:
        return os.path.getsize(path) if path else 0
    except OSError:
        return 0


def read_json(path: str, limit: int) -> object:
    """The JSON value in the first `limit` bytes of `path`; None if unreadable."""
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read(limit))
    except (OSError, ValueError, RecursionError):
        return None
