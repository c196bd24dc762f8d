"""A checkpoint that cannot be read is passed over: a restore takes the newest that reads.

A torn write on a shared filesystem (a data file cut short), a missing data
file, an unreadable index or a checksum mismatch makes TensorFlow's restore
fail the same way on every try (`IndexError: Read less bytes than requested`),
though older checkpoints of the same directory read fine. Hooked (the
bootstrap, once TensorFlow is imported):

- `tf.train.CheckpointManager(checkpoint, directory)`: before the manager reads
  its directory's `checkpoint` state file, the checkpoint that file names is
  verified, so its `latest_checkpoint` (what the tutorial's
  `checkpoint.restore(manager.latest_checkpoint)` and `restore_or_initialize()`
  read) and the list it prunes are the readable ones (tf_keras'
  `BackupAndRestore` builds one too);
- `tf.train.Checkpoint.restore(path)` / `read(path)`: the path is verified
  first (a path from `tf.train.latest_checkpoint`, say).

Verified: TensorFlow's reader opens the index and reads every tensor (each
tensor's crc32c is checked as it is read), one tensor at a time. A checkpoint
whose bytes say it is damaged is passed over for the next newest the state
file lists (`all_model_checkpoint_paths`), verified the same way, and so on.
Its files are moved to `damaged/<name>-<time it was saved>/` beside it (never
deleted: the next save would take its name) and the state file is rewritten
without it (written aside, then renamed). Each worker verifies the same
candidates in the same order, reading the same files, so every worker
restores the same checkpoint with no word between them: a peer that moved
the files first leaves them unreadable here too, and the state it rewrote
names the same one. An error that does not say the bytes are damaged (a
permission, an unreachable filesystem) changes nothing: the restore goes on
as the script asked. When no listed checkpoint reads, `NoReadableCheckpoint`
is raised and nothing is moved.

Each checkpoint passed over is reported (`passed_over`, `passed_over_why`,
`passed_over_to`, `passed_over_for`), said by the launcher. The cost: one more
read of the checkpoint a restart restores (from the page cache for the restore
that follows), once per process and checkpoint.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import threading
import time
from types import ModuleType

_MARK = "_mgpu_passes_damaged"
DAMAGED = "damaged"  # the folder beside, for the checkpoints passed over
_verified: dict[tuple, str] = {}  # (prefix, its files' sizes and times): "" reads, else why
_inside = threading.local()


class NoReadableCheckpoint(RuntimeError):
    """No checkpoint the directory's state file lists can be read."""


def _files(prefix: str) -> list[str]:
    return sorted(glob.glob(glob.escape(prefix) + ".data-?????-of-?????")) + (
        [prefix + ".index"] if os.path.exists(prefix + ".index") else [])


def _stamp(prefix: str) -> tuple:
    out = []
    for name in _files(prefix):
        try:
            info = os.stat(name)
        except OSError:
            continue
        out.append((name, info.st_size, info.st_mtime_ns))
    return (prefix, *out)


def damage(prefix: str) -> str | None:
    """Why the checkpoint `prefix` cannot be read, in words, when its bytes say it
    is damaged; "" when it reads; None when it cannot be told (an error that is
    not the checkpoint's: the restore then goes on as asked)."""
    key = _stamp(prefix)
    if key in _verified:
        return _verified[key]
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        why = ""
    except Exception as exc:  # noqa: BLE001 - judged by what it says
        why = _words(exc, prefix)
        if why is None:
            return None
    _verified[key] = why
    return why


def _words(exc: Exception, prefix: str) -> str | None:
    text = str(exc)
    data = os.path.basename(prefix) + ".data-"
    if isinstance(exc, IndexError) and "less bytes" in text:
        return "its data file is shorter than its index says (a torn or unfinished write)"
    if "Checksum does not match" in text:
        return "a tensor's checksum does not match (its data file is corrupt)"
    if "No such file or directory" in text and data in text:
        return "its data file is missing"
    if "Failed to find any matching files" in text:
        return "its index file is missing"
    if "sstable" in text or ("corrupt" in text and ".index" in text) \
            or "Bad table" in text or "corrupted compressed block" in text:
        return "its index cannot be read (corrupt or cut short)"
    if type(exc).__name__ == "DataLossError":
        return f"its data cannot be read ({text.splitlines()[0][:120] if text else 'data loss'})"
    return None


def _state(directory: str):
    """The raw `checkpoint` state (paths as written) of `directory`, or None."""
    from google.protobuf import text_format
    from tensorflow.python.checkpoint.checkpoint_management import CheckpointState

    try:
        with open(os.path.join(directory, "checkpoint"), encoding="utf-8") as handle:
            text = handle.read()
        state = CheckpointState()
        text_format.Merge(text, state)
    except (OSError, text_format.ParseError, UnicodeDecodeError):
        return None
    return state if state.model_checkpoint_path else None


def _full(directory: str, path: str) -> str:
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(directory, path))


def choose(prefix: object) -> object:
    """The checkpoint to restore in place of `prefix`: itself when it reads (or
    when it cannot be told), else the newest older one of its directory's state
    file that reads, the damaged ones moved aside and reported. Raises
    NoReadableCheckpoint when the state file lists none that reads."""
    if not isinstance(prefix, str | os.PathLike) or "://" in os.fspath(prefix):
        return prefix
    path = os.path.normpath(os.path.abspath(os.fspath(prefix)))
    why = damage(path)
    if not why:
        return prefix
    directory = os.path.dirname(path)
    state = _state(directory)
    listed = [_full(directory, p) for p in state.all_model_checkpoint_paths] if state else []
    if path in listed:
        older, passed = listed[:listed.index(path)], [(path, why)]
    elif _moved_by_a_peer(directory, path):  # a peer passed it over (and said so)
        older, passed = listed, []
    else:
        return prefix  # not one of the directory's series: restored as asked (and fails)
    for candidate in reversed(older):
        reason = damage(candidate)
        if reason is None:
            return prefix  # cannot be told: as asked
        if not reason:
            if passed:
                _pass_over(directory, state, passed, candidate)
            return candidate
        passed.append((candidate, reason))
    said = "; ".join(f"{os.path.basename(p)}: {w}" for p, w in passed or [(path, why)])
    raise NoReadableCheckpoint(
        f"no checkpoint in {directory} can be read ({said}); their files are kept as they "
        "are")


def _moved_by_a_peer(directory: str, path: str) -> bool:
    """A peer moved (some of) the files of `path` aside."""
    name = glob.escape(os.path.basename(path))
    return bool(glob.glob(os.path.join(glob.escape(os.path.join(directory, DAMAGED)),
                                       name + "-*", name + ".*")))


def _pass_over(directory: str, state, passed: list[tuple[str, str]], chosen: str) -> None:
    """Report each damaged checkpoint, move its files aside and rewrite the state
    file without it. Idempotent: a peer doing the same at the same time moves
    what is left, and writes the same state. In this order: the report (before
    a peer can read the new state and resume behind the last save), the data
    files, the state file, the index (`tf.train.latest_checkpoint`, a peer's,
    takes a listed checkpoint without its index for no checkpoint at all)."""
    stamps = dict(zip([_full(directory, p) for p in state.all_model_checkpoint_paths],
                      state.all_model_checkpoint_timestamps, strict=False)) if state else {}
    moved = {}
    for path, _ in passed:
        when = stamps.get(path)
        label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when)) if when else "unlisted"
        moved[path] = os.path.join(directory, DAMAGED, f"{os.path.basename(path)}-{label}")
    _report(passed, moved, chosen)
    for path, _ in passed:
        os.makedirs(moved[path], exist_ok=True)
        _move([n for n in _files(path) if not n.endswith(".index")], moved[path])
    if state is not None:
        _rewrite_state(directory, state, set(moved), chosen)
    for path, _ in passed:
        _move([n for n in _files(path) if n.endswith(".index")], moved[path])


def _report(passed: list[tuple[str, str]], moved: dict[str, str], chosen: str) -> None:
    from launcher import runtime

    for path, why in passed:
        runtime.write_progress({"passed_over": runtime.short_path(path),
                                "passed_over_why": why[:200],
                                "passed_over_to": runtime.short_path(moved[path]),
                                "passed_over_for": runtime.short_path(chosen),
                                "time": time.time()})
    print(f"mgpu-launch: checkpoint {', '.join(p for p, _ in passed)} cannot be read "
          f"({passed[0][1]}): restoring {chosen} instead; its files are kept in "
          f"{', '.join(sorted(set(moved.values())))}", file=sys.stderr, flush=True)


def _move(names: list[str], folder: str) -> None:
    for name in names:
        try:
            os.rename(name, os.path.join(folder, os.path.basename(name)))
        except FileNotFoundError:
            pass  # a peer moved it first


def _rewrite_state(directory: str, state, damaged: set[str], chosen: str) -> None:
    from google.protobuf import text_format

    paths = list(state.all_model_checkpoint_paths)
    stamps = list(state.all_model_checkpoint_timestamps)
    keep = [i for i, p in enumerate(paths) if _full(directory, p) not in damaged]
    new = type(state)()
    new.CopyFrom(state)
    del new.all_model_checkpoint_paths[:]
    del new.all_model_checkpoint_timestamps[:]
    new.all_model_checkpoint_paths.extend(paths[i] for i in keep)
    if len(stamps) == len(paths):
        new.all_model_checkpoint_timestamps.extend(stamps[i] for i in keep)
    if _full(directory, state.model_checkpoint_path) in damaged:
        written = next((paths[i] for i in keep if _full(directory, paths[i]) == chosen), chosen)
        new.model_checkpoint_path = written
    target = os.path.join(directory, "checkpoint")
    aside = f"{target}.mgpu-{os.getpid()}-{threading.get_ident()}"
    with open(aside, "w", encoding="utf-8") as handle:
        handle.write(text_format.MessageToString(new))
    os.replace(aside, target)


def _restore(original):
    def restore(self, save_path, *args, **kwargs):
        if getattr(_inside, "busy", False):
            return original(self, save_path, *args, **kwargs)
        _inside.busy = True
        try:
            chosen = choose(save_path)
        finally:
            _inside.busy = False
        return original(self, chosen, *args, **kwargs)

    return restore


def _manager_init(original):
    def init(self, checkpoint, directory, *args, **kwargs):
        try:
            folder = os.fspath(directory)
            state = _state(folder) if "://" not in folder else None
            if state is not None:
                choose(_full(folder, state.model_checkpoint_path))
        except NoReadableCheckpoint:
            raise
        except Exception:  # noqa: BLE001, S110 - a layout we do not know: built as asked
            pass
        return original(self, checkpoint, directory, *args, **kwargs)

    return init


def _wrap(cls: type, name: str, make) -> None:
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _MARK, True)
    setattr(cls, name, wrapper)


def on_tensorflow(module: ModuleType) -> None:
    for name in ("restore", "read"):
        _wrap(module.train.Checkpoint, name, _restore)
    _wrap(module.train.CheckpointManager, "__init__", _manager_init)


HOOKS = {"tensorflow": on_tensorflow}
