"""What the checkpoint directory says about training progress, as this machine sees it.

Owns reading the *state* of the checkpoints a job keeps in its shared
checkpoint directory, so the supervisor can tell whether a failed generation
moved the training forward. Modification times are not state: a script that
writes TensorBoard logs (or anything else) there and crashes must not look
like progress. What counts:

- TensorFlow's `checkpoint` index files (`tf.train.CheckpointManager`, tf_keras'
  `BackupAndRestore`): the number of the latest checkpoint (`ckpt-12`), which
  grows with every save and survives restores;
- Keras 3 `BackupAndRestore`'s `training_metadata.json`: the saved epoch and batch.

Reads files only; imports nothing of the launcher.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

State = dict[str, tuple[int, ...]]

# A huge directory (a dataset cache, say): what was seen by then is enough.
MAX_FILES = 10000
_LATEST = re.compile(r'^model_checkpoint_path:\s*"[^"]*?(\d+)"', re.M)


@dataclass(frozen=True)
class Moved:
    """The default checkpoint directory was in use by another live run
    (`claim`): this run uses the next free one, and starts from scratch."""

    wanted: Path
    used: Path


def checkpoint_state(directory: str | os.PathLike) -> State | None:
    """{relative path: position} of every checkpoint series under `directory`;
    None when the directory is not visible from here (e.g. only on the hosts)."""
    root = Path(directory)
    if not root.is_dir():
        return None
    state: State = {}
    seen = 0
    for folder, dirs, files in os.walk(root):
        # Hidden folders are scratch (a save in progress, a lock): not a checkpoint;
        # so are tf_keras' `workertemp_<i>`, a non-chief worker's copy deleted
        # right after its save (the chief's may still be being written).
        dirs[:] = [d for d in dirs if not d.startswith((".", "workertemp_"))]
        for name in files:
            seen += 1
            if seen > MAX_FILES:
                return state
            if name not in ("checkpoint", "training_metadata.json"):
                continue
            path = Path(folder, name)
            position = _position(path)
            if position is not None:
                state[str(path.relative_to(root))] = position
    return state


def _position(path: Path) -> tuple[int, ...] | None:
    try:
        text = path.read_text(errors="replace")[:65536]
    except OSError:
        return None
    if path.name == "checkpoint":
        match = _LATEST.search(text)
        return (int(match.group(1)),) if match else None
    try:
        data = json.loads(text)
        return int(data["epoch"]), int(data.get("batch") or 0)
    except (ValueError, KeyError, TypeError):
        return None


def advanced(before: State | None, after: State | None) -> bool:
    """Did any checkpoint series move forward (or appear) between the two looks?"""
    if not after:
        return False
    before = before or {}
    return any(key not in before or position > before[key] for key, position in after.items())


LOCK_NAME = ".mgpu-launch.lock"


class CheckpointDirBusy(Exception):
    """Another live run holds the checkpoint directory."""

    def __init__(self, directory: Path, owner: str) -> None:
        self.directory = directory
        self.owner = owner
        super().__init__(f"checkpoint directory {directory} is in use by {owner}")


def claim(directory: str | os.PathLike, run_dir: str | os.PathLike) -> int:
    """Hold `directory` for this run: an exclusive lock on its lock file, kept
    until this process ends (however it ends: the kernel drops the lock).
    Returns the lock's file descriptor; raises CheckpointDirBusy with the
    owner's run directory and pid when another live run holds it."""
    import fcntl

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = os.read(fd, 4096).decode("utf-8", "replace").strip() or "another run"
        os.close(fd)
        raise CheckpointDirBusy(folder, owner) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"the run in {run_dir} (launcher pid {os.getpid()})\n".encode())
    return fd
