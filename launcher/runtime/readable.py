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
  first (a path from `tf.train.latest_checkpoint`, say);
- TF1's `Saver.restore(sess, path)` (a plain loop's, or the chief's as a
  `MonitoredTrainingSession` forms): the same. Two savers of one directory
  that saved the same step (every worker saving, in a plain loop) leave an
  index of one and the data of the other: passed over as a checksum mismatch.

Verified: TensorFlow's reader opens the index and reads every tensor (each
tensor's crc32c is checked as it is read), one tensor at a time. A checkpoint
whose bytes say it is damaged, or whose values are not finite (a NaN or an
infinity in a tensor of two or more dimensions: a save after the weights
went bad that the sentinel's save check did not see; not with `sentinel:
off`), is passed over for the next newest the state file lists
(`all_model_checkpoint_paths`), verified the same way, and so on.
In a directory the job saves to (runtime/jobdirs.py; another, a warm
start's, is only read, and said so), its files are moved to
`damaged/<name>-<time it was saved>/` beside it (never
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

import glob
import json
import os
import sys
import threading
import time
from types import ModuleType

from . import jobdirs

_MARK = "_mgpu_passes_damaged"
DAMAGED = "damaged"  # the folder beside, for the checkpoints passed over
RECHECKS, RECHECK_S = 2, 0.5  # a file missing: looked at again, this often, this long apart
FOLLOW_S = 60.0  # at most, a worker waits for the chief's new state (MGPU_READABLE_FOLLOW_S)
RECENT_S = 600.0  # a damaged/ folder this recent was a peer's move (not an earlier run's)
_DATA_MISSING, _INDEX_MISSING = "its data file is missing", "its index file is missing"
_MISSING = (_DATA_MISSING, _INDEX_MISSING)
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


def damage(prefix: str, fresh: bool = False) -> str | None:
    """Why the checkpoint `prefix` cannot be read, in words, when its bytes say it
    is damaged; "" when it reads; None when it cannot be told (an error that is
    not the checkpoint's: the restore then goes on as asked). `fresh`: read
    again, whatever an earlier read of the same files said."""
    key = _stamp(prefix)
    if key in _verified and not fresh:
        return _verified[key]
    import tensorflow as tf
    from tensorflow.python.eager import context

    from .sentinel import enabled

    check = enabled()  # the values too, unless `sentinel: off`
    try:
        reader = tf.train.load_checkpoint(prefix)
        why, dtypes = "", reader.get_variable_to_dtype_map()
        # The model's names first: an optimizer's copy of a weight names it worse.
        for name in sorted(dtypes, key=lambda name: (name.startswith("optimizer"), name)):
            if dtypes[name] == tf.variant:  # an iterator's state: no numpy value, its bytes read
                with context.eager_mode():  # run, not built into a TF1 graph
                    tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name],
                                         shape_and_slices=[""], dtypes=[tf.variant])
                continue
            value = reader.get_tensor(name)
            why = _not_finite(name, value) if check else ""
            del value  # one tensor held at a time, as before the values were read
            if why:
                break  # damaged: the rest need not be read
    except Exception as exc:  # noqa: BLE001 - judged by what it says
        why = _words(exc, prefix)
        if why is None:
            return None
    _verified[key] = why
    return why


def _not_finite(name: str, value: object) -> str:
    """Words when a tensor of two or more dimensions holds a NaN or an
    infinity, "" otherwise. Weights trained on a NaN hold it in every kernel
    (a matrix or more); a vector or a scalar may hold one by design (a running
    minimum starting at infinity, a "not yet set" marker) and is not judged:
    the save check (sentinel.all_finite) judges a model's vectors as it saves."""
    from .sentinel import not_finite

    try:
        bad = not_finite(value, min_rank=2)
    except (TypeError, ValueError):
        return ""
    variable = name.removesuffix("/.ATTRIBUTES/VARIABLE_VALUE")
    return f"its tensor {variable} holds {bad} (trained after the loss went bad; " \
        "`sentinel: off` restores such a checkpoint as asked)" if bad else ""


def _words(exc: Exception, prefix: str) -> str | None:
    text = str(exc)
    data = os.path.basename(prefix) + ".data-"
    if "less bytes" in text:  # IndexError from the reader, OutOfRangeError from RestoreV2
        return "its data file is shorter than its index says (a torn or unfinished write)"
    if "checksum does not match" in text.lower() or "the checksum after" in text.lower():
        return "a tensor's checksum does not match (its data file is corrupt)"
    if "No such file or directory" in text and data in text:
        return _DATA_MISSING
    if "Failed to find any matching files" in text:
        return _INDEX_MISSING
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
    file that reads, the damaged ones passed over (moved aside and reported by
    the mover: see `_pass_over`). Raises NoReadableCheckpoint when the state
    file lists none that reads."""
    if not isinstance(prefix, str | os.PathLike) or "://" in os.fspath(prefix):
        return prefix
    path = os.path.normpath(os.path.abspath(os.fspath(prefix)))
    why = damage(path)
    if not why:
        return prefix
    directory = os.path.dirname(path)
    state = _state(directory)
    listed = _listed(directory, state)
    if path in listed and why in _MISSING:
        # A file missing may be a stale (NFS) lookup or a peer's move under way:
        # looked at again, and the state read again, before it counts.
        why, state = _recheck(path)
        if not why:
            return prefix
        listed = _listed(directory, state)
        if path not in listed:  # the state moved on (a peer passed it over): followed
            return choose(_full(directory, state.model_checkpoint_path)) if state else prefix
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
            if not passed:
                return candidate
            if not jobdirs.ours(directory):  # a warm start's, a shared model's: read only
                if _mover():  # said once (a peer that counts it as the job's may move it)
                    _report(passed, {}, candidate, "not a directory this job saves to: its "
                            "files and state file are left as they are")
                return candidate
            if _mover():
                _pass_over(directory, passed, candidate)
                return candidate
            return _follow(directory, passed, candidate)
        passed.append((candidate, reason))
    said = "; ".join(f"{os.path.basename(p)}: {w}" for p, w in passed or [(path, why)])
    raise NoReadableCheckpoint(
        f"no checkpoint in {directory} can be read ({said}); their files are kept as they "
        "are")


def _listed(directory: str, state) -> list[str]:
    return [_full(directory, p) for p in state.all_model_checkpoint_paths] if state else []


def _recheck(path: str) -> tuple[str | None, object]:
    """(why `path` cannot be read, the directory's state), after up to RECHECKS
    waits of RECHECK_S, each with the directory listed again (a stale negative
    lookup refreshed) and the checkpoint read again: done once it reads or the
    state no longer lists it."""
    directory, why, state = os.path.dirname(path), None, None
    for _ in range(RECHECKS):
        time.sleep(RECHECK_S)
        try:
            os.listdir(directory)
        except OSError:
            pass
        why, state = damage(path, fresh=True), _state(directory)
        if not why or path not in _listed(directory, state):
            break
    return why, state


def _mover() -> bool:
    """Only the chief (TF_CONFIG's `chief`, else worker 0; a script alone)
    moves damaged files and rewrites the state file: the others read only."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return True
    task = config.get("task") or {}
    if not config or not task:
        return True
    kind, index = task.get("type"), int(task.get("index", 0) or 0)
    return kind == "chief" or (kind == "worker" and index == 0
                               and not (config.get("cluster") or {}).get("chief"))


def _follow(directory: str, passed: list[tuple[str, str]], chosen: str) -> str:
    """A worker that is not the mover restores what the mover's decision left
    in the state file: it waits (at most FOLLOW_S) for the state to stop
    listing the damaged checkpoints, then restores the state's newest when it
    reads; else `chosen` (the same, read from the same files), read only."""
    damaged = {p for p, _ in passed}
    bound = _seconds("MGPU_READABLE_FOLLOW_S", FOLLOW_S)
    began, said = time.monotonic(), False
    while True:
        state = _state(directory)
        if state is not None and not damaged & {*_listed(directory, state),
                                                _full(directory, state.model_checkpoint_path)}:
            newest = _full(directory, state.model_checkpoint_path)
            return newest if newest == chosen or damage(newest) == "" else chosen
        if time.monotonic() - began >= bound:
            break
        if not said:
            said = True
            print(f"mgpu-launch: {', '.join(p for p, _ in passed)} cannot be read: waiting "
                  f"(at most {bound:g} s) for the chief to pass it over", file=sys.stderr,
                  flush=True)
        time.sleep(0.2)
    _report(passed, {}, chosen, f"the chief did not pass it over within {bound:g} s: "
            "restored read only, its files left as they are")
    return chosen


def _seconds(name: str, default: float) -> float:
    try:
        return max(0.0, float(os.environ.get(name, "") or default))
    except ValueError:
        return default


def _moved_by_a_peer(directory: str, path: str) -> bool:
    """A peer moved (some of) the files of `path` aside, recently (a folder of
    the same name left by an earlier generation does not count)."""
    name = glob.escape(os.path.basename(path))
    since = time.time() - RECENT_S
    for found in glob.glob(os.path.join(glob.escape(os.path.join(directory, DAMAGED)),
                                        name + "-*", name + ".*")):
        try:
            info = os.stat(found)
        except OSError:
            continue
        if max(info.st_ctime, info.st_mtime) >= since:  # a rename sets its ctime
            return True
    return False


def _kept_in(directory: str, path: str, stamps: dict[str, float]) -> str:
    """A new folder `damaged/<name>-<time it was saved>` for the files of
    `path`; with a suffix (pid, time) where that name is taken: never over
    files kept before."""
    when = stamps.get(path)
    label = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when)) if when else "unlisted"
    base = os.path.join(directory, DAMAGED, f"{os.path.basename(path)}-{label}")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    for folder in (base, f"{base}-{os.getpid()}-{time.time_ns()}"):
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue
    raise FileExistsError(base)


def _pass_over(directory: str, passed: list[tuple[str, str]], chosen: str) -> None:
    """Report each damaged checkpoint, move its files aside and rewrite the
    state file without it (the mover only). In this order: the data files, the
    new state written aside, the report (before a peer can read the new state
    and resume behind the last save), the state renamed into place, the index
    (`tf.train.latest_checkpoint`, a peer's, takes a listed checkpoint without
    its index for no checkpoint at all). A write that fails (a full disk) is
    said and changes nothing more: `chosen` is restored all the same, which
    needs no write."""
    state = _state(directory)
    stamps = dict(zip(_listed(directory, state), state.all_model_checkpoint_timestamps,
                      strict=False)) if state else {}
    moved: dict[str, str] = {}
    failed = []
    for path, _ in passed:
        try:
            moved[path] = _kept_in(directory, path, stamps)
            _move([n for n in _files(path) if not n.endswith(".index")], moved[path])
        except OSError as exc:
            failed.append(f"its files could not be moved aside ({_brief(exc)})")
    aside = None
    try:
        aside = _write_state(directory, {p for p, _ in passed}, chosen)
    except OSError as exc:
        failed.append(f"the state file could not be rewritten ({_brief(exc)})")
    _report(passed, moved, chosen, "; ".join(failed))
    if aside is not None:
        try:
            os.replace(aside, os.path.join(directory, "checkpoint"))
            aside = None
        except OSError as exc:
            _warn(f"the state file of {directory} could not be rewritten ({_brief(exc)})")
        finally:
            _unlink(aside)
    for path, _ in passed:
        if path in moved:
            try:
                _move([n for n in _files(path) if n.endswith(".index")], moved[path])
            except OSError as exc:
                _warn(f"the index of {path} could not be moved aside ({_brief(exc)})")


def _brief(exc: OSError) -> str:
    return f"{type(exc).__name__}: {exc.strerror or exc}"[:80]


def _warn(text: str) -> None:
    print(f"mgpu-launch: warning: {text}", file=sys.stderr, flush=True)


def _unlink(name: str | None) -> None:
    if name is not None:
        try:
            os.unlink(name)
        except OSError:
            pass


def _report(passed: list[tuple[str, str]], moved: dict[str, str], chosen: str,
            note: str = "") -> None:
    from launcher import runtime

    for path, why in passed:
        runtime.write_progress({"passed_over": runtime.short_path(path),
                                "passed_over_why": (why + (f"; {note}" if note else ""))[:200],
                                "passed_over_to": runtime.short_path(moved.get(path, "")),
                                "passed_over_for": runtime.short_path(chosen),
                                "time": time.time()})
    kept = (f"; its files are kept in {', '.join(sorted(set(moved.values())))}"
            if moved else "")
    print(f"mgpu-launch: checkpoint {', '.join(p for p, _ in passed)} cannot be read "
          f"({passed[0][1]}): restoring {chosen} instead{kept}"
          + (f"; {note}" if note else ""), file=sys.stderr, flush=True)


def _move(names: list[str], folder: str) -> None:
    for name in names:
        try:
            os.rename(name, os.path.join(folder, os.path.basename(name)))
        except FileNotFoundError:
            pass  # moved meanwhile


def _write_state(directory: str, damaged: set[str], chosen: str) -> str | None:
    """The directory's state file as it is now (read again: a save made since
    stays listed) without the `damaged` checkpoints, written aside and synced;
    its name, to be renamed into place (None: nothing to change)."""
    state = _state(directory)
    if state is None:
        return None
    paths = list(state.all_model_checkpoint_paths)
    stamps = list(state.all_model_checkpoint_timestamps)
    keep = [i for i, p in enumerate(paths) if _full(directory, p) not in damaged]
    newest_damaged = _full(directory, state.model_checkpoint_path) in damaged
    if len(keep) == len(paths) and not newest_damaged:
        return None
    new = type(state)()
    new.CopyFrom(state)
    del new.all_model_checkpoint_paths[:]
    del new.all_model_checkpoint_timestamps[:]
    new.all_model_checkpoint_paths.extend(paths[i] for i in keep)
    if len(stamps) == len(paths):
        new.all_model_checkpoint_timestamps.extend(stamps[i] for i in keep)
    if newest_damaged:
        new.model_checkpoint_path = paths[keep[-1]] if keep else chosen
    return _write_aside(directory, new)


def _write_aside(directory: str, state) -> str:
    """`state` written beside `directory`'s state file and synced; its name."""
    from google.protobuf import text_format

    aside = f"{os.path.join(directory, 'checkpoint')}.mgpu-{os.getpid()}-{threading.get_ident()}"
    try:
        with open(aside, "w", encoding="utf-8") as handle:
            handle.write(text_format.MessageToString(state))
            handle.flush()
            os.fsync(handle.fileno())  # a host crash leaves the old state, never an empty one
    except OSError:
        _unlink(aside)
        raise
    return aside


def newest(directory: str) -> str | None:
    """The checkpoint `directory`'s state file names newest (its full prefix), or None."""
    state = _state(directory)
    return _full(directory, state.model_checkpoint_path) if state is not None else None


def name_newest(directory: str, bad: str, previous: str | None) -> bool:
    """A save of non-finite weights made anyway (`tf.train.Checkpoint.save`,
    runtime/saves.py): where the state file names `bad` newest, it names
    `previous` again (the newest before that save, its index still there), or
    is removed when there is none: `latest_checkpoint`, a restart's restore,
    is the last good save. `bad`'s files are kept (the script holds its path).
    Written aside, synced and renamed, as `choose` does; True when done."""
    state = _state(directory)
    if state is None or _full(directory, state.model_checkpoint_path) != _full(directory, bad):
        return False
    target = os.path.join(directory, "checkpoint")
    if previous is None or not os.path.exists(previous + ".index"):
        try:
            os.unlink(target)  # no good save before it: a restart starts from scratch
        except OSError as exc:
            _warn(f"the state file of {directory} could not be removed ({_brief(exc)})")
            return False
        return True
    new = type(state)()
    new.model_checkpoint_path = previous
    new.all_model_checkpoint_paths.append(previous)
    aside = None
    try:
        aside = _write_aside(directory, new)
        os.replace(aside, target)
        aside = None
    except OSError as exc:
        _warn(f"the state file of {directory} could not be rewritten ({_brief(exc)})")
        return False
    finally:
        _unlink(aside)
    return True


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


def _saver_restore(original):
    """`Saver.restore(sess, save_path)`: the path verified first, as above."""
    def restore(self, *args, **kwargs):
        if getattr(_inside, "busy", False):
            return original(self, *args, **kwargs)
        keyword = "save_path" in kwargs
        path = kwargs["save_path"] if keyword else (args[1] if len(args) > 1 else None)
        _inside.busy = True
        try:
            chosen = choose(path)
        finally:
            _inside.busy = False
        if keyword:
            return original(self, *args, **{**kwargs, "save_path": chosen})
        return original(self, *args[:1], chosen, *args[2:], **kwargs) if len(args) > 1 \
            else original(self, *args, **kwargs)

    return restore


def _manager_init(original):
    def init(self, checkpoint, directory, *args, **kwargs):
        try:
            folder = os.fspath(directory)
            if "://" not in folder:
                from . import memslots

                jobdirs.manager_built(folder)  # the job saves there: damaged files moved

                if os.environ.get("MGPU_MEMORY_DIR"):  # the tier's copy under way: in place first
                    memslots.wait_for_copy(memslots.shared_of(folder))
                else:  # an earlier run's copy that died after its commit (the tier off now)
                    memslots.finish_publish(folder)
            state = _state(folder) if "://" not in folder else None
            if state is not None:
                choose(_full(folder, state.model_checkpoint_path))
        except NoReadableCheckpoint:
            raise
        except Exception:  # noqa: BLE001, S110 - a layout we do not know: built as asked
            pass
        return original(self, checkpoint, directory, *args, **kwargs)

    return init


def _latest(original):
    """`tf.train.latest_checkpoint`: TensorFlow reads the state file, then looks
    for the index of the checkpoint it names; where the chief moved that index
    aside meanwhile (after renaming a new state into place) it finds none, and
    says there is no checkpoint at all: the state is read again."""
    def latest(checkpoint_dir, latest_filename=None):
        found = original(checkpoint_dir, latest_filename)
        if found is None and latest_filename is None:
            folder = os.fspath(checkpoint_dir)
            if "://" not in folder and os.path.isdir(os.path.join(folder, DAMAGED)):
                found = original(checkpoint_dir, latest_filename)
        return found

    return latest


def _wrap(cls: object, name: str, make) -> None:
    from .hooks import wrap_method

    wrap_method(cls, name, make, _MARK)


def on_tensorflow(module: ModuleType) -> None:
    for name in ("restore", "read"):
        _wrap(module.train.Checkpoint, name, _restore)
    _wrap(module.train.CheckpointManager, "__init__", _manager_init)
    _wrap(module.train, "latest_checkpoint", _latest)
    saver = sys.modules.get("tensorflow.python.training.saver")  # loaded with TensorFlow
    if saver is not None:
        _wrap(saver.Saver, "restore", _saver_restore)


HOOKS = {"tensorflow": on_tensorflow}
