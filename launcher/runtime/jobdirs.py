"""The checkpoint directories that are the job's, as a task knows them: where a
damaged checkpoint may be moved aside and the state file rewritten
(runtime/readable.py). A directory the job only reads (a warm start from a
pretrained model, a directory shared with other teams) is never changed: its
damaged newest is passed over read only.

The job's: the directories the launcher heard the job save to in its earlier
generations and its `checkpoint.dir` (MGPU_SAVE_DIRS, MGPU_CHECKPOINT_DIR:
job/policy/savedirs.py), any a `tf.train.CheckpointManager` of this process
was built for (tf_keras' `BackupAndRestore` builds one), and the memory
tier's folders; a worker's `workertemp_<n>` stands for its parent. A task
started without MGPU_SAVE_DIRS (a script run alone, an older launcher)
treats every directory as its own, as before.

Standard library only; must not import the launcher side.
"""

from __future__ import annotations

import os

ENV = "MGPU_SAVE_DIRS"  # job/policy/savedirs.py's: os.pathsep between directories
_managers: set[str] = set()  # directories a CheckpointManager of this process was built for


def _key(directory: str) -> str:
    from .memslots import shared_of

    return shared_of(os.path.realpath(directory))


def manager_built(directory: str) -> None:
    _managers.add(_key(directory))


def ours(directory: str) -> bool:
    """May this job change `directory` (move files aside, rewrite its state)?"""
    listed = os.environ.get(ENV)
    if listed is None:
        return True
    key = _key(directory)
    memory = os.environ.get("MGPU_MEMORY_DIR")
    if memory and key.startswith(os.path.realpath(memory) + os.sep):
        return True
    given = [p for p in (*listed.split(os.pathsep), os.environ.get("MGPU_CHECKPOINT_DIR", ""))
             if p]
    return key in _managers or key in {_key(p) for p in given}
