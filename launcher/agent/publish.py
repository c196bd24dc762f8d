"""A copy's files into a directory at once, as a restore sees them.

A save is several files (a TensorFlow checkpoint's data, index and state
file; Keras 3's backup weights and the metadata that says their epoch), and
Keras' are rewritten in place under the same names: renamed one by one, a
copy killed between two renames would leave new weights with old metadata.
So the memory tier's copy (launcher/agent/memcopy.py):

1. stages every file aside (`.NAME.mgpu-part`, flushed, its mtime the save's
   when it names the save);
2. writes the journal (JOURNAL, aside then renamed: the commit point), which
   lists the staged names in their order (the files that name a save last);
3. renames each into place, then removes the journal.

A copy killed before its journal leaves the previous save, whole (its parts
are removed by the next copy); one killed after is rolled forward (`finish`)
by the next copy to the directory, and by a restore before it reads the
directory (runtime/memslots.py: finish_publish, the same names), once no
agent marks a copy under way there: either way the restore reads one save's
files, all old or all new.

Standard library only.
"""

from __future__ import annotations

import json
import os

PART = ".mgpu-part"
JOURNAL = ".mgpu-publish"  # runtime/memslots.py: PUBLISH, the same name
ORDER = ".mgpu-order"  # the saves' order, published with them (saveorder.ORDER)


def aside(folder: str, name: str) -> str:
    return os.path.join(folder, f".{name}{PART}")


def stage(source: str, folder: str, name: str, when: float | None = None) -> None:
    """`source` written aside as `folder/name`'s part, flushed; with `when`,
    its mtime that time (the save's: saveorder.newer_in)."""
    import shutil  # here: every agent imports this module, few copy

    part = aside(folder, name)
    if os.path.isdir(source):
        shutil.rmtree(part, ignore_errors=True)
        shutil.copytree(source, part)
    else:
        shutil.copyfile(source, part)
        with open(part, "rb+") as handle:
            os.fsync(handle.fileno())
    _stamp(part, when)


def stage_text(folder: str, name: str, text: str, when: float | None = None) -> None:
    part = aside(folder, name)
    with open(part, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    _stamp(part, when)


def commit(folder: str, names: list[str]) -> None:
    """The staged `names` into place, in order, all or (after a crash, rolled
    forward by `finish`) none."""
    if len(names) > 1:
        part = aside(folder, JOURNAL)
        with open(part, "w", encoding="utf-8") as handle:
            json.dump(list(names), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(part, os.path.join(folder, JOURNAL))
    for name in names:
        place(folder, name)
    remove_journal(folder)


def finish(folder: str) -> bool:
    """A publish that died after its journal: its renames done (True)."""
    try:
        with open(os.path.join(folder, JOURNAL), encoding="utf-8") as handle:
            names = json.load(handle)
    except (OSError, ValueError):
        return False
    for name in names if isinstance(names, list) else ():
        if isinstance(name, str) and os.sep not in name and (
                not name.startswith(".") or name == ORDER):
            place(folder, name)
    remove_journal(folder)
    return True


def place(folder: str, name: str) -> None:
    """Its part renamed into place (a folder: the old one moved aside first);
    nothing when the part is gone (placed already)."""
    part, final = aside(folder, name), os.path.join(folder, name)
    try:
        if os.path.isdir(part) and os.path.isdir(final):
            old = final + PART + "-old"
            os.replace(final, old)
            os.replace(part, final)
            _rmtree(old)
        else:
            os.replace(part, final)
    except FileNotFoundError:
        pass  # placed already (a restore on another host rolled it forward)


def remove_journal(folder: str) -> None:
    try:
        os.unlink(os.path.join(folder, JOURNAL))
    except FileNotFoundError:
        pass


def sweep(folder: str) -> None:
    """A publish that died after its journal is finished; what one that died
    before it left is removed (never a complete save)."""
    finish(folder)
    for name in os.listdir(folder):
        if PART in name:
            path = os.path.join(folder, name)
            _rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _rmtree(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _stamp(path: str, when: float | None) -> None:
    if when is not None:
        os.utime(path, (when, when))
