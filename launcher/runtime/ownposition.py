"""A custom loop's input iterator in its checkpoint: each worker continues
from its own position, not the chief's.

TF's custom-loop tutorial puts the input's iterator in its
`tf.train.Checkpoint` (`iterator=iter(dataset)`, a plain tf.data iterator per
worker: TensorFlow cannot checkpoint a distributed one) and every worker
restores the chief's checkpoint (`tf.train.latest_checkpoint` of the chief's
directory; a worker's own save goes to `workertemp_<n>` and is removed). The
iterator's state there is the chief's: its shard, its position, its shuffle
buffer. Restored on another worker, that worker reads the chief's samples
from the chief's place: with two workers killed in the middle of an epoch, 5
samples of 64 trained twice and 5 never (tests/test_ctl_iterator.py).

So, zero code: on a worker that is not the chief (several workers), each
`tf.train.Checkpoint.save` and `CheckpointManager.save` of a checkpoint that
holds tf.data iterators (as its own attributes) first writes those iterators
alone, the worker's own position, to
`<directory>/.mgpu-positions/<n>w-worker-<i>/<name>-<N>` (`<name>-<N>`: the
save's own, N the same on every worker; `<directory>`: the one the chief
saves to, a `workertemp_<n>` left out, the memory tier's working folder
mapped to the directory it stands for; `<n>w`: the number of workers, whose
shards a position belongs to). Before the save, not after: a peer's failure
may stop this worker while its own save is written and the chief's is made.
After a restore of `<name>-<N>` (whichever checkpoint the restore took:
runtime/readable.py passes over damaged ones) the worker reads its own
iterators' state from its copy of it over the chief's. Where there is none
(a save by `write`, which numbers nothing; a copy that could not be written;
another number of workers) or it does not match (another pipeline), it says
once that this worker continues from the chief's position: nothing silent.
Not seen: an iterator held deeper than the checkpoint's own attributes, or
attached after the restore (restored later, from the chief's).

Bounded: a worker keeps the copies of the saves its directory's state file
still lists (of the same name: two savers of one directory keep theirs) and
any newer, at most `KEEP` where it lists none; before writing `<name>-<N>`
it removes an older copy of it, and a restore of `<name>-<N>` removes its
copies numbered above N (a run gone back from, whose numbers the next saves
use again, maybe at other steps). The cost: one more serialization of the
iterators (their shuffle buffers) per save, on the workers that are not the
chief, written to the directory directly. A failure here is said, never
raised into the script's save or restore.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from types import ModuleType

_MARK = "_mgpu_own_position"
FOLDER = ".mgpu-positions"
KEEP = 8  # copies a worker keeps where its directory's state file lists none of its saves
_NUMBERED = re.compile(r"^(.*)-(\d+)$")  # a save's path: its name, its number
_said: set[str] = set()


def _a_worker_not_the_chief() -> bool:
    from launcher import runtime

    return runtime.num_workers() > 1 and runtime.task_type() == "worker" \
        and not runtime.is_chief()


def _folder(directory: str) -> str:
    """This worker's copies for the checkpoints of `directory`."""
    from launcher import runtime

    from .memslots import shared_of

    if os.environ.get("MGPU_MEMORY_DIR"):  # a manager's working folder in memory
        from .memtier import stands_for

        directory = stands_for(directory) or directory
    task = f"{runtime.num_workers()}w-{runtime.task_type()}-{runtime.task_index()}"
    return os.path.join(shared_of(directory), FOLDER, task)


def _iterators(checkpoint: object) -> dict[str, object]:
    """The tf.data iterators `checkpoint` holds, by the name it gave them (its
    own attributes: one held deeper, or attached after a restore, is not seen)."""
    import tensorflow as tf

    children = getattr(checkpoint, "_trackable_children", None)
    try:
        found = children() if children is not None else {}
    except Exception:  # noqa: BLE001 - a checkpoint of a shape we do not know: none
        return {}
    return {name: value for name, value in found.items()
            if isinstance(value, tf.data.Iterator) and hasattr(value, "_serialize_to_tensors")}


def _unwrapped(name: str):
    """`tf.train.Checkpoint.<name>` as TensorFlow wrote it: a copy is no save
    to time or check, nor a restore to choose for."""
    import inspect

    import tensorflow as tf

    return inspect.unwrap(getattr(tf.train.Checkpoint, name))


def _number_next(checkpoint: object, given: object) -> int:
    """The number the save about to be made takes: `given` (a manager's
    `checkpoint_number`: an int, a tensor or a step variable, read as the
    manager reads it), else the save counter's next."""
    if given is None:
        return int(checkpoint.save_counter) + 1
    if isinstance(given, int):
        return given
    from tensorflow.python.training import training_util

    return int(training_util.global_step(sess=None, global_step_tensor=given))


def _skipped_by_interval(manager, check_interval: bool) -> bool:
    """The manager's `checkpoint_interval` will skip this save (its own test)."""
    interval = getattr(manager, "_checkpoint_interval", None)
    last = getattr(manager, "_last_checkpoint_step", None)
    if interval is None or last is None or not check_interval:
        return False
    from tensorflow.python.training import training_util

    step = training_util.global_step(sess=None, global_step_tensor=manager._step_counter)
    return int(step) < last + interval


def _asynchronous(options: object) -> bool:
    """An async checkpoint: its thread saves later, the iterator moved on by then."""
    return bool(getattr(options, "experimental_enable_async_checkpoint", False))


def keep_own(checkpoint: object, directory: str, name: str, given: object = None) -> None:
    """Before the save `<name>-<number>` of `checkpoint` into `directory` is
    made (`given`: a manager's `checkpoint_number`; the iterator is where the
    save will find it): this worker's own iterators' state beside the chief's
    directory, any older copy of that number removed first (numbers are used
    again after a restore of an older save). Before, not after: a peer's
    failure may stop this worker while its own save is written, the chief's
    made."""
    iterators = _iterators(checkpoint)
    if not iterators or "://" in directory:
        return
    import tensorflow as tf

    try:
        number = _number_next(checkpoint, given)
    except Exception as exc:  # noqa: BLE001 - a counter read only in a graph, say
        _say(f"this worker's input position is not kept at {name}'s saves: their number "
             f"cannot be read before the save ({type(exc).__name__}): a restore continues "
             "from the chief's position")
        return
    folder = _folder(directory)
    try:
        _remove(folder, name, lambda n: n == number)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _unwrapped("write")(tf.train.Checkpoint(**iterators),
                            os.path.join(folder, f"{name}-{number}"))
    except Exception as exc:  # noqa: BLE001 - a full disk, a folder we may not write
        _say(f"this worker's input position at save {name}-{number} could not be kept "
             f"({type(exc).__name__}: {str(exc)[:200]}): a restore of that save continues "
             "from the chief's position")
        return
    try:
        _sweep(folder, directory, name, number)
    except Exception:  # noqa: BLE001, S110 - kept longer: swept at the next save
        pass


def take_own(checkpoint: object, restored: object) -> None:
    """After a restore of the checkpoint `restored` (its path): this worker's
    own iterators' state over the chief's, or said where there is none."""
    path = os.fspath(restored) if isinstance(restored, str | os.PathLike) else ""
    iterators = _iterators(checkpoint) if path and "://" not in path else {}
    if not iterators:
        return
    import tensorflow as tf

    match = _NUMBERED.match(os.path.basename(path))
    folder = _folder(os.path.dirname(path))
    copy = os.path.join(folder, os.path.basename(path)) if match else ""
    try:  # copies of later saves are of a run the restore went back from: stale
        if match:
            _remove(folder, match.group(1), lambda n: n > int(match.group(2)))
    except OSError:
        pass
    if not copy or not os.path.exists(copy + ".index"):
        _say(f"{os.path.basename(path)} holds the chief's input position (its iterator's "
             "state) and this worker kept none of its own for it (a save by `write`, or by "
             "another number of workers): it reads on from the chief's shard and place, so "
             "some samples are trained twice and some never until the epoch ends")
        return
    try:
        _unwrapped("read")(tf.train.Checkpoint(**iterators), copy) \
            .assert_existing_objects_matched()
    except Exception as exc:  # noqa: BLE001 - a copy torn or of another pipeline
        _say(f"this worker's own input position for {os.path.basename(path)} could not be "
             f"read ({type(exc).__name__}: {str(exc)[:200]}): it continues from the chief's")
        return
    _say(f"this worker's input continues from its own position at {os.path.basename(path)} "
         "(the checkpoint holds the chief's)")


def _sweep(folder: str, directory: str, name: str, number: int) -> None:
    """Copies of `name`'s saves older than those of it the directory's state
    file lists (the chief's); where it lists none, all but the newest KEEP.
    Never the one just written, nor a newer one."""
    import tensorflow as tf

    from .memslots import shared_of

    state = tf.train.get_checkpoint_state(shared_of(directory))
    listed = [int(m.group(2)) for p in (state.all_model_checkpoint_paths if state else ())
              if (m := _NUMBERED.match(os.path.basename(p))) and m.group(1) == name]
    numbers = sorted(set(_copies(folder, name).values()))
    oldest = min(listed) if listed else (numbers[-KEEP] if len(numbers) > KEEP else 0)
    _remove(folder, name, lambda n: n < min(oldest, number))


def _copies(folder: str, name: str) -> dict[str, int]:
    """The files of `name`'s copies in `folder` (a write cut short included):
    file name, the save's number."""
    try:
        found = os.listdir(folder)
    except FileNotFoundError:
        return {}
    pattern = re.compile(re.escape(name) + r"-(\d+)(\.index|\.data-\d+-of-\d+|_temp.*)$")
    return {f: int(m.group(1)) for f in found if (m := pattern.match(f))}


def _remove(folder: str, name: str, which) -> None:
    for found, number in _copies(folder, name).items():
        if which(number):
            path = os.path.join(folder, found)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _say(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(f"mgpu-launch: {text}", file=sys.stderr, flush=True)


def _save(original):
    def save(self, file_prefix, *args, **kwargs):
        try:
            if _a_worker_not_the_chief() \
                    and not _asynchronous(kwargs.get("options", args[0] if args else None)):
                prefix = os.fspath(file_prefix)
                keep_own(self, os.path.dirname(prefix), os.path.basename(prefix))
        except Exception:  # noqa: BLE001, S110 - a prefix of a shape we do not know: as asked
            pass
        return original(self, file_prefix, *args, **kwargs)

    return save


def _manager_save(original):
    def save(self, *args, **kwargs):
        try:
            prefix = getattr(self, "_checkpoint_prefix", None)  # TensorFlow's: <dir>/<name>
            given = kwargs.get("checkpoint_number", args[0] if args else None)
            check = kwargs.get("check_interval", args[1] if len(args) > 1 else True)
            options = kwargs.get("options", args[2] if len(args) > 2 else None)
            if prefix is not None and _a_worker_not_the_chief() and not _asynchronous(options) \
                    and not _skipped_by_interval(self, check):
                directory = os.fspath(self.directory)
                if os.environ.get("MGPU_MEMORY_DIR"):  # the tier's: saved in memory for it
                    from .memtier import directory_of

                    directory = directory_of(self)
                keep_own(self.checkpoint, directory, os.path.basename(os.fspath(prefix)), given)
        except Exception:  # noqa: BLE001, S110 - a manager of a shape we do not know: as asked
            pass
        return original(self, *args, **kwargs)

    return save


def _read(original):
    def read(self, save_path, *args, **kwargs):
        status = original(self, save_path, *args, **kwargs)
        try:
            if _a_worker_not_the_chief():
                take_own(self, save_path)
        except Exception:  # noqa: BLE001, S110 - the restore as asked
            pass
        return status

    return read


def on_tensorflow(module: ModuleType) -> None:
    from .hooks import wrap_method

    wrap_method(module.train.Checkpoint, "save", _save, _MARK)
    wrap_method(module.train.CheckpointManager, "save", _manager_save, _MARK)
    # Inside runtime/readable.py's (registered after): the path read is the one it chose.
    wrap_method(module.train.Checkpoint, "read", _read, _MARK)


HOOKS = {"tensorflow": on_tensorflow}
