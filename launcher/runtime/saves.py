"""Checkpoint saves timed and reported: the evidence that training moved.

Post-import hooks wrap the methods that save a checkpoint:

- Keras 3 and tf_keras: `BackupAndRestore` (`_save_model`, tf_keras' `_backup`)
  and `ModelCheckpoint` (`_save_model`);
- TensorFlow: `tf.train.CheckpointManager.save` (a custom loop's saves, and
  tf_keras' BackupAndRestore underneath), `tf.train.Checkpoint.save` and `write`;
- TF1 graph code: `tf.compat.v1.train.Saver.save` (called directly or by
  `MonitoredTrainingSession`'s `CheckpointSaverHook`), its step the global step
  the save wrote (the `-N` of the path it returned, which the Saver read
  before writing; else the graph's global step, read once as the save
  begins: the other workers move a counter shared on a ps while it writes,
  and the save holds at least the step read before it, maybe not one read
  after). A `Saver` with nothing to save returns None: no save. A
  graph-mode Keras callback's step (the seed's `K.set_session` shape) is read
  as its save begins (runtime.steps).

Each save that returns (not one that raised, nor an asynchronous write still
under way) and whose weights are all finite (runtime/sentinel.py: one that is
not is reported as `saved_nonfinite`, never as a save, and is not made at all
by a Keras callback or a `CheckpointManager`; a `tf.train.Checkpoint.save`'s
is made, then taken off its directory's newest) is reported to the
launcher at once: `saved` (the optimizer's step count at the save), `saved_dir`
(the directory, wherever the script keeps it), `saved_with` (the Keras or
TensorFlow saver; `saved_by_runtime` for `runtime.callbacks()`' own) and
`checkpoint` (progress: the restart after it is free of `max_restarts`).

Only a save that wrote is one. `ModelCheckpoint._save_model` is called at
every epoch (or `save_freq`) and decides there whether to write: with
`save_best_only=True` a metric that did not improve writes nothing (nor does
tf_keras' `period` between its saves). Its call is reported only when a
write ran inside it and returned: `Model.save` / `save_weights` (both Kerases,
`writes` marks them) or a wrapped TensorFlow save.

Each save's duration is added up here and sent with the next step report as
`save_s` (`runtime.write_progress`): the launcher counts that time as
checkpointing, not training. A save inside a save (tf_keras' backup calls its
CheckpointManager) counts once. A script that saves some other way can say
how long it took: `runtime.report_checkpoint(step, save_s=seconds)`.

The cost: two clock reads and one progress line per save. Standard library
only at import time; must not import the launcher side.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType

_MARK = "_mgpu_times_saves"
_WRITE_MARK = "_mgpu_marks_writes"

_lock = threading.Lock()
_pending_s = 0.0  # saved since the last report
_inside = threading.local()


def take() -> float:
    """The seconds spent saving since the last call (0.0: none)."""
    global _pending_s
    with _lock:
        seconds, _pending_s = _pending_s, 0.0
    return seconds


def note(seconds: float) -> None:
    global _pending_s
    with _lock:
        _pending_s += max(seconds, 0.0)


def pending() -> bool:
    with _lock:
        return _pending_s > 0.0


# Where a saver writes, from the wrapped call: (instance, args, kwargs) -> directory.
Where = Callable[[object, tuple, dict], "str | None"]


# What a save of non-finite weights returns instead of saving (saver -> result).
Skip = Callable[[object], object]

# A save's step, from the wrapped call and what it returned (instance, args,
# kwargs, result) -> step; without it, the step counter's (steps.step_of).
# It raises NotWritten where the call wrote nothing: no save is reported.
StepOf = Callable[[object, tuple, dict, object], "int | None"]

# A save's step read as it began (instance, args, kwargs) -> step, or None.
StepBefore = Callable[[object, tuple, dict], "int | None"]

# A save of non-finite weights made anyway (its path is the script's): called
# as it begins (instance, args, kwargs), it returns what takes the save off the
# directory's newest once made (its result -> done), so no restart restores it.
Aside = Callable[[object, tuple, dict], Callable[[object], bool]]


class NotWritten(Exception):
    """A saver's call that returned having written nothing."""


def timed(cls: type, name: str, where: Where | None = None, *,
          decides: bool = False, skip: Skip | None = None, step: StepOf | None = None,
          first: StepBefore | None = None, aside: Aside | None = None) -> None:
    """Wrap `cls.<name>` (a method that saves) to time it (once); with `where`,
    a save that returned is reported (`completed`) with its directory, once its
    weights were found finite (runtime/sentinel.py). With `decides` (the method
    may write nothing: ModelCheckpoint's), only a call inside which a write
    returned (`writes`, or a nested timed save) is. A save whose weights are
    not finite is reported as `saved_nonfinite` and, with `skip`, not made at
    all: the directory's newest save stays the last good one (nothing deleted);
    with `aside`, made, then taken off the newest, then reported.
    With `step`, the save's step is read from the call and its result; with
    `first`, as the call begins (else a graph-mode Keras model's)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def save(*args, **kwargs):
        if getattr(_inside, "saving", False):
            result = original(*args, **kwargs)
            _inside.wrote = True
            return result
        saver = args[0] if args else None
        finite = where is None or _finite(saver)
        _last["refused"] = not finite if where is not None else _last["refused"]
        after = None  # a save of non-finite weights made, to take off the newest
        if not finite:
            if aside is not None and skip is None:
                after = aside(saver, args, kwargs)
            else:
                _nonfinite(saver, where, args, kwargs, skipped=skip is not None)
            if skip is not None:
                return skip(saver)
        before = _step_before(saver, args, kwargs, first) if where is not None else None
        _inside.saving, _inside.wrote = True, False
        began = time.monotonic()
        done, result = False, None
        try:
            result = original(*args, **kwargs)
            done = True
            return result
        finally:
            _inside.saving = False
            note(time.monotonic() - began)
            if done and finite and where is not None and not _asynchronous(args, kwargs) \
                    and (_inside.wrote or not decides):
                _completed(saver, where, args, kwargs, result, step, before)
            if done and after is not None:  # reported once off the newest: a stop may follow
                _nonfinite(saver, where, args, kwargs, skipped=False, set_aside=_set(after,
                                                                                      result))

    setattr(save, _MARK, True)
    setattr(cls, name, save)


def writes(cls: type, name: str) -> None:
    """Wrap `cls.<name>` (a write a checkpoint callback makes: `Model.save`,
    `save_weights`) to mark, inside a timed save, that it wrote. Outside one
    it is not a save the launcher counts (a model saved at the start would
    make every restart of a crash loop free) and is neither timed nor told."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _WRITE_MARK, False):
        return

    @functools.wraps(original)
    def write(*args, **kwargs):
        result = original(*args, **kwargs)
        if getattr(_inside, "saving", False):
            _inside.wrote = True
        return result

    setattr(write, _WRITE_MARK, True)
    setattr(cls, name, write)


def _asynchronous(args: tuple, kwargs: dict) -> bool:
    """A TensorFlow write with async checkpointing on: it returns before it completed."""
    for value in (*args[1:], *kwargs.values()):
        if getattr(value, "experimental_enable_async_checkpoint", False) is True:
            return True
    return False


def _step_before(saver: object, args: tuple, kwargs: dict,
                 first: StepBefore | None) -> int | None:
    try:
        step = first(saver, args, kwargs) if first is not None else None
    except Exception:  # noqa: BLE001 - a layout we do not know: as a Keras save
        step = None
    return step if step is not None else _graph_step(saver)


def _graph_step(saver: object) -> int | None:
    """A graph-mode Keras model's step counter, read as its save begins: a
    counter shared on a ps moves while the save writes (the other workers
    train on), and the save holds at least this step, never less: a restart
    from it resumes at or past the step reported."""
    from . import steps

    try:
        model = getattr(saver, "model", None)  # a Keras callback's; a Saver has none
        return steps.graph_step(model) if model is not None else steps.graph_now()
    except Exception:  # noqa: BLE001 - a layout we do not know: read after, as elsewhere
        return None


def _completed(saver: object, where: Where, args: tuple, kwargs: dict, result: object = None,
               step_of: StepOf | None = None, before: int | None = None) -> None:
    """Report a completed save: its step (`before`: the graph-mode step read
    as it began) and directory (best effort)."""
    from . import steps

    try:
        directory = where(saver, args, kwargs)
        step = step_of(saver, args, kwargs, result) if step_of is not None else None
        if step is None:
            step = before if before is not None else steps.step_of(getattr(saver, "model", None))
    except Exception:  # noqa: BLE001 - a layout we do not know: no report, no harm
        return
    if not directory:
        return
    from launcher import runtime

    runtime.report_saved(step, os.path.abspath(str(directory)), saved_with=saved_with(saver),
                         by_runtime=bool(getattr(saver, RUNTIME_MARK, False)))


_last = {"refused": False}  # the last checked save's weights were not finite


def last_refused() -> bool:
    """The last save checked here was refused (its weights not finite): no save
    is to be reported for it (runtime.callbacks()' reporter asks)."""
    return _last["refused"]


def _finite(saver: object) -> bool:
    from . import sentinel

    return sentinel.save_is_finite(saver)


def _set(after: Callable[[object], bool], result: object) -> bool:
    try:
        return after(result)
    except Exception:  # noqa: BLE001 - a layout we do not know: left as TensorFlow wrote it
        return False


def _nonfinite(saver: object, where: Where, args: tuple, kwargs: dict, skipped: bool,
               set_aside: bool = False) -> None:
    """A save of non-finite weights: no progress, no resume point, said as such."""
    from . import steps

    try:
        directory = where(saver, args, kwargs) or ""
        step = steps.step_of(getattr(saver, "model", None))
    except Exception:  # noqa: BLE001 - a layout we do not know: said without them
        directory, step = "", None
    from launcher import runtime

    from . import memslots

    # A non-chief worker's scratch folder (`workertemp_<n>`) named as the
    # directory it stands for: the one the user knows and the restart reads.
    directory = str(directory)
    record: dict = {"saved_nonfinite": -1 if step is None else int(step), "time": time.time(),
                    "saved_dir": runtime.short_path(directory if "://" in directory else
                                                    memslots.shared_of(directory))
                    if directory else ""}
    if skipped:
        record["save_skipped"] = 1
    if set_aside:  # made, but no longer the directory's newest
        record["save_set_aside"] = 1
    from . import sentinel

    if sentinel.spoiled_by_spike():  # finite, but trained past a spike rolled back
        record["saved_after_spike"] = 1
    said = sentinel.loss_at_save(step, rolled_back=skipped or set_aside)
    if said:  # "bad": the loss's own report (told first) decides; else ("finite",
        record["saved_loss"] = said  # "unwatched") this one, on the chief only
    if runtime.is_chief():  # a fit's refused save rolls back on the chief only
        record["chief"] = 1
    runtime.write_progress(record)


RUNTIME_MARK = "_mgpu_runtime"  # set on the BackupAndRestore of runtime.callbacks()


def saved_with(saver: object) -> str:
    """What made a save: keras3, keras2 (a Keras 2 `keras`), tf_keras, tensorflow
    (a tf.train saver), or "" (none of these): the drill's advice follows it."""
    root = type(saver).__module__.partition(".")[0]
    if root == "keras":
        version = str(getattr(sys.modules.get("keras"), "__version__", ""))
        return "keras2" if version.startswith("2") else "keras3"
    return root if root in ("tf_keras", "tensorflow") else ""


def _backup_dir(saver, args, kwargs) -> str | None:
    return getattr(saver, "backup_dir", None)


def _filepath_dir(saver, args, kwargs) -> str | None:  # ModelCheckpoint's templated path
    path = getattr(saver, "filepath", None)
    return (os.path.dirname(os.fspath(path)) or ".") if path else None


def _manager_dir(saver, args, kwargs) -> str | None:
    # With the memory tier (runtime/memtier.py) the manager saves to memory for it.
    return getattr(saver, "_mgpu_target", None) or getattr(saver, "directory", None)


def _prefix_dir(saver, args, kwargs) -> str | None:  # Checkpoint.save/write(file_prefix)
    prefix = args[1] if len(args) > 1 else kwargs.get("file_prefix")
    return (os.path.dirname(os.fspath(prefix)) or ".") if prefix else None


def on_keras(module: ModuleType) -> None:
    """`keras` (Keras 3) or `tf_keras` imported: its checkpoint callbacks."""
    callbacks = module.callbacks
    for cls_name, methods, where in (
            ("BackupAndRestore", ("_save_model", "_backup"), _backup_dir),
            ("ModelCheckpoint", ("_save_model",), _filepath_dir)):
        cls = getattr(callbacks, cls_name, None)
        for method in methods if cls is not None else ():
            timed(cls, method, where, decides=cls_name == "ModelCheckpoint", skip=_nothing)
    for method in ("save", "save_weights"):  # what ModelCheckpoint writes with
        writes(module.Model, method)


def _nothing(saver: object) -> None:  # a Keras callback's save returns nothing
    return None


def _latest(manager: object) -> object:  # CheckpointManager.save: the last good one's path
    return getattr(manager, "latest_checkpoint", None)


def _saver_dir(saver, args, kwargs) -> str | None:  # Saver.save(sess, save_path, ...)
    path = args[2] if len(args) > 2 else kwargs.get("save_path")
    return (os.path.dirname(os.fspath(path)) or ".") if path else None


_NUMBERED = re.compile(r"-(\d+)$")


def _saver_step(saver, args, kwargs, result) -> int | None:
    """The global step a TF1 `Saver.save` wrote: the `-N` its path ends with
    when it was given one (it read the global step itself, before writing);
    else None: the step read as the save began (`_saver_before`) is told."""
    if result is None:  # nothing to save (allow_empty): it wrote nothing
        raise NotWritten
    given = args[3] if len(args) > 3 else kwargs.get("global_step")
    found = _NUMBERED.search(os.fspath(result)) if given is not None else None
    return int(found.group(1)) if found else None


def _saver_before(saver, args, kwargs) -> int | None:
    """The graph's global step as a `Saver.save` with no `global_step` begins."""
    given = args[3] if len(args) > 3 else kwargs.get("global_step")
    if given is not None:
        return None  # the Saver reads it (its `-N`)
    return global_step_of(args[1] if len(args) > 1 else kwargs.get("sess"))


def global_step_of(session) -> int | None:
    """The global step of `session`'s graph, read once (None: it has none)."""
    training_util = sys.modules.get("tensorflow.python.training.training_util")
    graph = getattr(session, "graph", None)
    if training_util is None or graph is None:
        return None
    tensor = training_util.get_global_step(graph)
    return None if tensor is None else int(session.run(tensor))


def _off_the_newest(saver, args, kwargs) -> Callable[[object], bool]:
    """`Checkpoint.save` of non-finite weights: the newest its directory's state
    named before it is named again once it is made (runtime/readable.py)."""
    from . import readable

    directory = _prefix_dir(saver, args, kwargs)
    previous = readable.newest(directory) if directory else None
    return lambda result: bool(directory) and readable.name_newest(
        directory, os.path.abspath(os.fspath(result)), previous)


def on_tensorflow(module: ModuleType) -> None:
    # Checkpoint.save/write return the path they wrote, which a script may
    # read: those are made and said (saved_nonfinite), not skipped; a save's is
    # then taken off its directory's newest (`write` names no newest).
    timed(module.train.CheckpointManager, "save", _manager_dir, skip=_latest)
    timed(module.train.Checkpoint, "save", _prefix_dir, aside=_off_the_newest)
    timed(module.train.Checkpoint, "write", _prefix_dir)
    saver = sys.modules.get("tensorflow.python.training.saver")  # loaded with TensorFlow
    if saver is not None:
        timed(saver.Saver, "save", _saver_dir, step=_saver_step, first=_saver_before)


HOOKS = {"keras": on_keras, "tf_keras": on_keras, "tensorflow": on_tensorflow}
