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
holds tf.data iterators also writes those iterators alone, the worker's own
position, to `<directory>/.mgpu-positions/<n>w-<task>-<i>/ckpt-<N>` (N: the
save's number, the same on every worker; `<directory>`: the one the chief
saves to, a `workertemp_<n>` left out; `<n>w`: the number of workers, whose
shards a position belongs to). After a restore of `ckpt-N` (whichever
checkpoint the restore took: runtime/readable.py passes over damaged ones),
the worker reads its own iterators' state from its copy of N over the
chief's. Where there is none (a save by `write`, which numbers nothing; the
copy's write failed; another number of workers), it says once that this
worker continues from the chief's position, so nothing is silent.

Bounded: a worker keeps the copies of the saves its directory's state file
still lists and any newer (at most `KEEP` without a state file); a restore
of `ckpt-N` removes its copies numbered above N (a run gone back from, whose
numbers the next saves use again, maybe at other steps). The cost: one
more serialization of the iterators (their shuffle buffers) per save, on the
workers that are not the chief. A failure here is said, never raised into
the script's save or restore.

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
KEEP = 8  # copies a worker keeps where its directory has no state file
_NUMBERED = re.compile(r"-(\d+)$")
_said: set[str] = set()


def _several_non_chief() -> bool:
    from launcher import runtime

    return runtime.num_workers() > 1 and not runtime.is_chief()


def _folder(directory: str) -> str:
    """This worker's copies for the checkpoints of `directory`."""
    from launcher import runtime

    from .memslots import shared_of

    task = f"{runtime.num_workers()}w-{runtime.task_type()}-{runtime.task_index()}"
    return os.path.join(shared_of(directory), FOLDER, task)


def _iterators(checkpoint: object) -> dict[str, object]:
    """The tf.data iterators `checkpoint` holds, by the name it gave them."""
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


def keep_own(checkpoint: object, directory: str, saved: object) -> None:
    """After a save numbered as `saved` ends (its path): this worker's own
    iterators' state beside the chief's directory."""
    match = _NUMBERED.search(os.fspath(saved)) if saved is not None else None
    iterators = _iterators(checkpoint) if match else {}
    if not iterators:
        return
    import tensorflow as tf

    folder = _folder(directory)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        _unwrapped("write")(tf.train.Checkpoint(**iterators),
                            os.path.join(folder, f"ckpt-{match.group(1)}"))
        _sweep(folder, directory)
    except Exception as exc:  # noqa: BLE001 - a full disk, a folder we may not write
        _say(f"this worker's input position at save {match.group(1)} could not be kept "
             f"({type(exc).__name__}: {str(exc)[:200]}): a restore of that save continues "
             "from the chief's position")


def take_own(checkpoint: object, restored: object) -> None:
    """After a restore of the checkpoint `restored` (its path): this worker's
    own iterators' state over the chief's, or said where there is none."""
    path = os.fspath(restored) if restored is not None else ""
    iterators = _iterators(checkpoint) if path and "://" not in path else {}
    if not iterators:
        return
    import tensorflow as tf

    match = _NUMBERED.search(path)
    folder = _folder(os.path.dirname(path))
    copy = os.path.join(folder, f"ckpt-{match.group(1)}") if match else ""
    try:  # copies of later saves are of a run the restore went back from: stale
        _remove(folder, lambda number: bool(match) and number > int(match.group(1)))
    except OSError:
        pass  # kept: a copy is read only for its own number's restore
    if not copy or not os.path.exists(copy + ".index"):
        _say(f"{os.path.basename(path)} holds the chief's input position (its iterator's "
             "state) and this worker kept none of its own for it (a save by `write`, or by "
             "another number of workers): it reads on from the chief's shard and place, so "
             "some samples are trained twice and some never until the epoch ends")
        return
    try:
        _unwrapped("read")(tf.train.Checkpoint(**iterators), copy).expect_partial()
    except Exception as exc:  # noqa: BLE001 - a copy torn or of another pipeline
        _say(f"this worker's own input position for {os.path.basename(path)} could not be "
             f"read ({type(exc).__name__}: {str(exc)[:200]}): it continues from the chief's")
        return
    _say(f"this worker's input continues from its own position at {os.path.basename(path)} "
         "(the checkpoint holds the chief's)")


def _sweep(folder: str, directory: str) -> None:
    """Copies of saves older than those the directory's state file lists
    (the chief's); without one, all but the newest KEEP."""
    import tensorflow as tf

    numbers = sorted(set(_numbers(folder).values()))
    state = tf.train.get_checkpoint_state(_shared(directory))
    listed = [int(m.group(1)) for p in (state.all_model_checkpoint_paths if state else ())
              if (m := _NUMBERED.search(p))]
    oldest = min(listed) if listed else (numbers[-KEEP] if len(numbers) > KEEP else 0)
    _remove(folder, lambda number: number < oldest)


def _numbers(folder: str) -> dict[str, int]:
    """The copies' files in `folder`: name, the save's number."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    return {name: int(m.group(1)) for name in names if (m := re.match(r"ckpt-(\d+)\.", name))}


def _remove(folder: str, which) -> None:
    for name, number in _numbers(folder).items():
        if which(number):
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _shared(directory: str) -> str:
    from .memslots import shared_of

    return shared_of(directory)


def _say(text: str) -> None:
    if text not in _said:
        _said.add(text)
        print(f"mgpu-launch: {text}", file=sys.stderr, flush=True)


def _save(original):
    def save(self, file_prefix, *args, **kwargs):
        result = original(self, file_prefix, *args, **kwargs)
        if _several_non_chief():
            keep_own(self, os.path.dirname(os.fspath(file_prefix)), result)
        return result

    return save


def _manager_save(original):
    def save(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if _several_non_chief():
            directory = os.fspath(self.directory)
            if os.environ.get("MGPU_MEMORY_DIR"):  # the tier's: saved in memory for it
                from .memtier import directory_of

                directory = directory_of(self)
            keep_own(self.checkpoint, directory, result)
        return result

    return save


def _read(original):
    def read(self, save_path, *args, **kwargs):
        status = original(self, save_path, *args, **kwargs)
        if _several_non_chief():
            take_own(self, save_path)
        return status

    return read


def on_tensorflow(module: ModuleType) -> None:
    from .hooks import wrap_method

    wrap_method(module.train.Checkpoint, "save", _save, _MARK)
    wrap_method(module.train.CheckpointManager, "save", _manager_save, _MARK)
    # Inside runtime/readable.py's (registered after): the path read is the one it chose.
    wrap_method(module.train.Checkpoint, "read", _read, _MARK)


HOOKS = {"tensorflow": on_tensorflow}
