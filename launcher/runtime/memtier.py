"""Checkpoints at memory speed: an unmodified script's saves go to host memory.

Installed only with `checkpoint: {memory: true}` (the agent then sets
`MGPU_MEMORY_DIR`, this task's private folder under /dev/shm: nothing is
hooked otherwise). Post-import hooks redirect the saves the runtime knows
(runtime/saves.py times the same methods, around these):

- `tf.train.CheckpointManager` (custom loops, and tf_keras' BackupAndRestore
  underneath): built on a working folder in memory instead of its directory;
  each completed save is a slot of hard links (TensorFlow writes new files,
  never in place);
- Keras 3 `BackupAndRestore` and `ModelCheckpoint` (Keras 3 and tf_keras):
  each save is written into the working folder and moved into a slot.

The save returns once it is in memory; the slot's path goes to the agent on
the progress channel (`memory_saved`), and the agent copies it to the
script's own directory in the background, written aside then renamed
(launcher/agent/memcopy.py). A restore reads the shared directory's newest
checkpoint, served from a slot on this host that holds the very same save
(same name and sizes) when there is one: the same checkpoint on every worker,
from memory where it can be. At most MGPU_MEMORY_COPIES slots per task; a
full /dev/shm sends saves to their directory again, said once.

Standard library only at import time; must not import the launcher side.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import sys
import time
from types import ModuleType

from . import memslots, nearest

ENV_DIR = "MGPU_MEMORY_DIR"
ENV_COPIES = "MGPU_MEMORY_COPIES"
_MARK = "_mgpu_memory_tier"
_state = {"seq": 0, "told": False, "full": False, "last_bytes": 0}
# (target, saver) -> the saver's newest slot the agent copies (agent/memcopy.py: saver_of)
_pending: dict[tuple[str, ...], str] = {}
END_WAIT_S = 600.0  # at most, at the program's end, for the last copies
_seeded: set[str] = set()  # working folders filled in this process (a second saver shares it)
_built: list[str] = []  # the directories of this process's managers, in order
_working: dict[str, str] = {}  # a manager's working folder in memory: the directory it stands for


def enabled() -> bool:
    return bool(os.environ.get(ENV_DIR))


def full() -> bool:
    """Saves go to their directory again (memory full): no extra saves then."""
    return bool(_state["full"])


def _root() -> str:
    return os.environ[ENV_DIR]


def _copies() -> int:
    try:
        return max(1, int(os.environ.get(ENV_COPIES, "2")))
    except ValueError:
        return 2


def _chief() -> bool:
    """Only the chief's saves are copied to the shared directory (the others'
    are scratch, or the same weights a second time)."""
    try:
        task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task") or {}
        cluster = json.loads(os.environ.get("TF_CONFIG") or "{}").get("cluster") or {}
    except ValueError:
        return True
    kind, index = task.get("type"), task.get("index", 0)
    return kind in (None, "chief") or (kind == "worker" and index == 0 and "chief" not in cluster)


def _local(path: object) -> str | None:
    text = os.fspath(path) if isinstance(path, str | os.PathLike) else None
    return None if not text or "://" in text else os.path.abspath(text)


def _room(estimate: int = 0) -> bool:
    """Memory can take one more save (twice the last one's size free; before
    the first, twice `estimate`: the model's variables), else saves go to
    their directory from now on, said once."""
    if _state["full"]:
        return False
    need = 2 * max(_state["last_bytes"], estimate)
    if need and memslots.free_bytes(_root()) < need:
        _fall_back(f"{need // 2**20} MiB more do not fit")
    return not _state["full"]


def _fall_back(why: str) -> None:
    if not _state["full"]:
        _state["full"] = True
        print(f"mgpu-launch: memory tier full ({why}): this task's checkpoints are saved "
              "directly to their directory from now on", file=sys.stderr, flush=True)


def _tell_start(target: str) -> None:
    if not _state["told"]:
        _state["told"] = True
        copied = (f"the agent copies each to {target}" if _chief() else
                  "kept for restores (the chief's are copied to the directory)")
        print(f"mgpu-launch: checkpoints saved in memory ({_root()}, at most {_copies()} "
              f"copies of this task's saves); {copied}", file=sys.stderr, flush=True)


def _new_slot() -> str:
    root = _root()
    _state["seq"] = max(_state["seq"] + 1, memslots.next_seq(root))
    slot = os.path.join(root, f"s-{_state['seq']:08d}")
    os.mkdir(slot, 0o700)
    return slot


@contextlib.contextmanager
def _filling(slot: str):
    """A slot being filled: removed whole if its save does not complete (no room)."""
    try:
        yield slot
    except BaseException:
        shutil.rmtree(slot, ignore_errors=True)
        raise


def _order() -> dict:
    """Where this save stands among the job's (agent/saveorder.py): its run,
    generation, process and this process's count of saves."""
    try:
        generation = int(os.environ.get("MGPU_GENERATION", "0"))
    except ValueError:
        generation = 0
    process = f"{os.environ.get('MGPU_MEMORY_HOST', '')}:{os.getpid()}"
    return {"run": os.environ.get("MGPU_RUN_ID", ""), "generation": generation,
            "process": process, "seq": _state["seq"]}


def _publish(slot: str, target: str, kind: str, pointer: str, step: int | None) -> None:
    """The slot is complete: its manifest, the bound, and the agent told."""
    names = memslots.ordered([n for n in os.listdir(slot) if n != memslots.MANIFEST])
    memslots.seal(slot, {"target": target, "key": memslots.key_of(target), "kind": kind,
                         "pointer": pointer, "files": names, "step": step,
                         "copy": _chief(), "time": time.time(), **_order()})
    if _chief():
        if not _pending:
            import atexit

            atexit.register(_wait_for_copies)  # before the bootstrap's end (registered first)
        naming = [n for n in names if n in memslots.POINTERS] or names
        _pending[(target, kind, *naming)] = slot  # two savers of one directory: both waited for
    if kind != "drop":  # a drop is its manifest alone: no save's size
        _state["last_bytes"] = memslots.size_of(slot)
    memslots.prune(_root(), _copies())
    _tell_start(target)
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if fd:
        try:
            os.write(int(fd), (json.dumps({"memory_saved": slot}) + "\n").encode())
        except (OSError, ValueError):
            pass


def _wait_for_copies() -> None:
    """The program ends: the agent's copies of its last saves are in their
    directories first (the job's end would cut them). Told as a save, which the
    launcher never cuts short (launcher/job/detect/tailcut.py)."""
    from . import position

    deadline, said = time.monotonic() + END_WAIT_S, False
    left = list(_pending.values())
    position.enter(position.SAVE)
    while left and time.monotonic() < deadline:
        left = [s for s in left if os.path.isdir(s) and not os.path.exists(
            os.path.join(s, "copied"))]
        if left and not said and time.monotonic() > deadline - END_WAIT_S + 1.0:
            said = True
            print("mgpu-launch: waiting for the copy of the last checkpoint to "
                  f"{', '.join(sorted({key[0] for key in _pending}))}", file=sys.stderr, flush=True)
        time.sleep(0.05)
    if left:
        print(f"mgpu-launch: the last checkpoint's copy took over {END_WAIT_S:.0f} s; its "
              "directory keeps the previous one", file=sys.stderr, flush=True)


def _step(model) -> int | None:
    from . import steps

    try:
        return steps.step_of(model)
    except Exception:  # noqa: BLE001 - a layout we do not know: no step
        return None


def _wrap(cls: object, name: str, make) -> None:
    from .hooks import wrap_method

    wrap_method(cls, name, make, _MARK)


# --- tf.train.CheckpointManager --------------------------------------------

def _state_file(folder: str) -> tuple[str, list[str]] | None:
    """(latest, all) checkpoint names of a TensorFlow `checkpoint` state file."""
    try:
        with open(os.path.join(folder, "checkpoint"), encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    latest, every = None, []
    for line in text.splitlines():
        field, _, value = line.partition(":")
        value = value.strip().strip('"')
        if field.strip() == "model_checkpoint_path":
            latest = value
        elif field.strip() == "all_model_checkpoint_paths":
            every.append(value)
    return (latest, every) if latest else None


def _checkpoint_files(folder: str, name: str) -> dict[str, int]:
    base = os.path.basename(name)
    return {n: os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
            if n.startswith(base + ".")}


def _seed_manager(work: str, target: str) -> str:
    """Fill the working folder with the shared directory's newest checkpoint:
    from a slot holding the same save when there is one, else read from the
    directory. Returns where it came from ('' when there is nothing)."""
    if work in _seeded:
        return "seeded"
    _seeded.add(work)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    target = memslots.shared_of(target)
    memslots.wait_for_copy(target)  # an agent's copy under way: the newest, in place first
    state = _state_file(target) if os.path.isdir(target) else None
    if state is None:
        return ""
    name = os.path.basename(state[0])
    sizes = _checkpoint_files(target, name)
    slot = nearest.fill(work, target, list(sizes), lambda: memslots.matching(
        memslots.sibling_roots(_root()), memslots.key_of(target), "manager", name, sizes),
        _root())  # a copy being placed here raced against the directory
    source = slot or target
    # The directory's state file as it is: the older checkpoints it lists stay
    # there (not read), kept or deleted by the manager's rule as the saves go on.
    shutil.copyfile(os.path.join(target, "checkpoint"), os.path.join(work, "checkpoint"))
    _note_restore_source(target, name, "memory" if slot else "shared", source)
    return source


def _stands_for(target: str) -> str:
    """The directory whose checkpoints a manager's saves are: its own, or for
    a non-chief worker's scratch folder (`P/workertemp_<n>`) the one its
    restores read: P itself (TF's custom-loop tutorial), or `P/chief` where a
    manager was built on it before in this process (tf_keras' BackupAndRestore).
    The worker's saves then hold the same checkpoint under the same key, and a
    restart restores it from this host's memory."""
    shared = memslots.shared_of(target)
    if shared == target:
        return target
    tf_keras = os.path.join(shared, "chief")
    return tf_keras if tf_keras in _built and shared not in _built else shared


def _manager_init(original):
    def init(self, checkpoint, directory, *args, **kwargs):
        target = _local(directory)
        if target is None or not _room():
            return original(self, checkpoint, directory, *args, **kwargs)
        stands_for = _stands_for(target)
        work = memslots.working(_root(), stands_for)
        try:
            _seed_manager(work, stands_for)
        except OSError as exc:
            _fall_back(f"{type(exc).__name__}: {exc}")
            return original(self, checkpoint, directory, *args, **kwargs)
        original(self, checkpoint, work, *args, **kwargs)
        _working[os.path.normpath(work)] = target
        self._mgpu_target = target
        self._mgpu_stands_for = stands_for
        _built.append(stands_for)
        if stands_for != memslots.shared_of(target):  # tf_keras' P/chief
            # tf_keras made this scratch folder for its saves and removes it after
            # each through the manager's directory, now in memory: not left behind.
            _remove_empty(target)
    return init


def directory_of(manager) -> str:
    """The directory a `CheckpointManager` saves for, as the script named it:
    its `directory` is the working folder in memory while the tier holds its saves."""
    return getattr(manager, "_mgpu_target", None) or os.fspath(manager.directory)


def stands_for(folder: str) -> str | None:
    """The directory a manager's working folder in memory saves for (None: not one)."""
    return _working.get(os.path.normpath(folder))


def _manager_save(original):
    def save(self, *args, **kwargs):
        target = getattr(self, "_mgpu_target", None)
        if target is None:
            return original(self, *args, **kwargs)
        if not _room():
            _to_directory(self, target)
            return original(self, *args, **kwargs)
        options = kwargs.get("options")
        if options is not None and getattr(options, "experimental_enable_async_checkpoint",
                                           False):
            kwargs["options"] = copy.copy(options)  # memory is fast: written at once
            kwargs["options"].experimental_enable_async_checkpoint = False
        try:
            path = original(self, *args, **kwargs)
            _snapshot_manager(self, getattr(self, "_mgpu_stands_for", target), path)
        except Exception as exc:
            if not memslots.no_space(exc):
                raise
            _fall_back("no space left")
            _to_directory(self, target)
            return original(self, *args, **kwargs)
        _trim_working(self._directory)
        shared = memslots.shared_of(target)
        if getattr(self, "_mgpu_stands_for", target) == shared:
            # The directory the script saved to exists, as after a save of its own;
            # a worker's scratch folder holds (links to) what it saved: TF's
            # custom-loop tutorial removes it (`tf.io.gfile.rmtree`) after each
            # save, scripts list or copy their files. Its bytes stay in memory (a
            # scratch save is never copied). Not tf_keras' (removed at the start:
            # it removes its scratch folder through the manager's directory).
            if target != shared:
                memslots.mirror(self._directory, target)
            os.makedirs(target, exist_ok=True)
        return path
    return save


def _trim_working(work: str) -> None:
    """Memory stays bounded: the working folder keeps the files of the newest
    `memory_copies` checkpoints its state file lists; the manager keeps its own
    `max_to_keep` (its `checkpoints`, its state file, and so the directory:
    the agent's copy deletes only what that state no longer lists)."""
    state = _state_file(work)
    if state is None:
        return
    gone = {os.path.basename(n) for n in state[1][:-_copies()]} - {os.path.basename(state[0])}
    for name in os.listdir(work):
        if any(name.startswith(g + ".") for g in gone):
            _remove(os.path.join(work, name))


def _snapshot_manager(manager, target: str, path: object) -> None:
    work = manager._directory
    with _filling(_new_slot()) as slot:
        for name in os.listdir(work):
            if os.path.isfile(os.path.join(work, name)) and not name.startswith("."):
                os.link(os.path.join(work, name), os.path.join(slot, name))
        model = None
        for value in vars(getattr(manager, "_checkpoint", object())).values():
            model = value if hasattr(value, "optimizer") else model
        _publish(slot, target, "manager", os.path.basename(os.fspath(path)), _step(model))


def _to_directory(manager, target: str) -> None:
    """This manager saves to its directory again (memory full)."""
    os.makedirs(target, exist_ok=True)  # a scratch folder removed at the start
    manager._directory = target
    manager._checkpoint_prefix = os.path.join(target, os.path.basename(manager._checkpoint_prefix))
    manager._mgpu_target = None


# --- Keras callbacks ----------------------------------------------------------

_BACKUP_FILES = ("_weights_path", "_training_metadata_path", "_prev_weights_path",
                 "_prev_training_metadata_path")


def _backup_begin(original):
    """Keras 3 BackupAndRestore: restore from a slot holding the directory's
    backup when there is one; then its saves go to memory."""
    def begin(self, *args, **kwargs):
        target = _local(getattr(self, "backup_dir", None))
        if target is None or not hasattr(self, "_weights_path") \
                or not _room(memslots.estimate(getattr(self, "model", None))):
            return original(self, *args, **kwargs)
        shared = {a: getattr(self, a) for a in _BACKUP_FILES if hasattr(self, a)}
        work = memslots.working(_root(), target, "backup")
        source = _seed_backup(work, target, os.path.basename(shared["_weights_path"]))
        if source == "memory":
            _point(self, shared, work)
        try:
            return original(self, *args, **kwargs)
        finally:
            _point(self, shared, work)
            self._mgpu_target, self._mgpu_shared = target, shared
    return begin


def _keras_direct(callback) -> None:
    """This callback saves to its directory again (memory full): a backup's
    paths name its directory's files (its working folder's until now)."""
    shared = getattr(callback, "_mgpu_shared", None)
    if shared:
        for attr, path in shared.items():
            setattr(callback, attr, path)
        callback._mgpu_was = callback._mgpu_target  # its copies still waiting: dropped at the end
    callback._mgpu_target = None


def _backup_end(original):
    """Keras deletes its backup at the end of `fit`: so does the agent, after
    any copy still under way (a `drop` slot)."""
    def end(self, *args, **kwargs):
        # tf_keras: its training state's manager, whose memory folder it removes.
        state = getattr(self, "_training_state", None)
        manager = getattr(state, "write_checkpoint_manager", None)
        target = getattr(self, "_mgpu_target", None) or getattr(manager, "_mgpu_target", None)
        was = getattr(self, "_mgpu_was", None)  # on the tier until memory filled up
        shared_dir = getattr(self, "backup_dir", None)
        if target is not None and hasattr(self, "_weights_path"):
            # Keras 3 removes its backup_dir itself: the working folder instead,
            # the directory by the agent after its copies (the `drop` slot).
            self.backup_dir = memslots.working(_root(), target, "backup")
        try:
            result = original(self, *args, **kwargs)
        finally:
            self.backup_dir = shared_dir
        dropped = target or was
        if dropped is not None and getattr(self, "delete_checkpoint", True):
            # After the copies still waiting (a copy of a save made before memory
            # filled up would bring back the backup Keras removed).
            with contextlib.suppress(OSError), _filling(_new_slot()) as slot:
                _publish(slot, memslots.shared_of(dropped), "drop", "", None)
        return result
    return end


def _point(callback, shared: dict[str, str], folder: str) -> None:
    for attr, path in shared.items():
        setattr(callback, attr, os.path.join(folder, os.path.basename(path)))


def _seed_backup(work: str, target: str, weights: str) -> str:
    memslots.wait_for_copy(target)  # an agent's copy under way: the newest, in place first
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, mode=0o700)
    try:
        with open(os.path.join(target, "training_metadata.json"), encoding="utf-8") as h:
            pointer = h.read()
        sizes = {weights: os.path.getsize(os.path.join(target, weights))}
    except OSError:
        return ""
    slot = memslots.matching(memslots.settled_roots(_root()), memslots.key_of(target),
                             "keras", pointer, sizes)
    if slot is None:
        _note_restore_source(target, pointer.strip(), "shared", target)
        return "shared"
    for name in (weights, "training_metadata.json"):
        os.link(os.path.join(slot, name), os.path.join(work, name))
    _note_restore_source(target, pointer.strip(), "memory", slot)
    return "memory"


def _keras_save(original):
    """Keras 3 BackupAndRestore._save_model and ModelCheckpoint._save_model
    (both Keras): written into the working folder, then moved into a slot."""
    def save(self, *args, **kwargs):
        target = getattr(self, "_mgpu_target", None)
        checkpoint_path = getattr(self, "filepath", None) if target is None else None
        if checkpoint_path is not None and hasattr(self, "_save_model") \
                and not hasattr(self, "backup_dir"):
            target = _local(os.path.dirname(os.fspath(checkpoint_path)) or ".")
        if target is None:
            return original(self, *args, **kwargs)
        if not _room(memslots.estimate(getattr(self, "model", None))):
            _keras_direct(self)
            return original(self, *args, **kwargs)
        work = memslots.working(_root(), target,
                                "backup" if hasattr(self, "backup_dir") else "model")
        _empty(work)  # what a failed save left (this saver's)
        if checkpoint_path is not None:
            self.filepath = os.path.join(work, os.path.basename(os.fspath(checkpoint_path)))
        try:
            result = original(self, *args, **kwargs)
            _snapshot_keras(self, work, target)
        except Exception as exc:
            if not memslots.no_space(exc):
                raise
            _empty(work)
            _fall_back("no space left")
            _keras_direct(self)
            if checkpoint_path is not None:
                self.filepath = checkpoint_path
            return original(self, *args, **kwargs)  # to its directory
        finally:
            if checkpoint_path is not None:
                self.filepath = checkpoint_path
        return result
    return save


def _empty(folder: str) -> None:
    for name in os.listdir(folder):
        _remove(os.path.join(folder, name))


def _snapshot_keras(callback, work: str, target: str) -> None:
    names = [n for n in os.listdir(work) if not n.endswith(".bkp")]
    if not names:
        return  # nothing written (save_best_only, not the best)
    with _filling(_new_slot()) as slot:
        for name in os.listdir(work):
            if name.endswith(".bkp"):
                _remove(os.path.join(work, name))
            else:
                os.replace(os.path.join(work, name), os.path.join(slot, name))
        pointer = ""
        try:
            with open(os.path.join(slot, "training_metadata.json"), encoding="utf-8") as h:
                pointer = h.read()
        except OSError:
            pass
        _publish(slot, target, "keras", pointer, _step(getattr(callback, "model", None)))


def _remove_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass  # not empty, or gone: the script's


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def _note_restore_source(target: str, name: str, source: str, path: str) -> None:
    """Where a restore reads from: told with the task's resume (runtime/restores)."""
    from . import restores

    host = os.environ.get("MGPU_MEMORY_HOST") or os.uname().nodename
    record = memslots.manifest(path) if source == "memory" else None
    if record and record.get("peer"):  # a copy that came from another host's memory
        source, host = "peer", str(record.get("held_by") or host)
    restores.copy_source = {"resumed_from": source, "resumed_copy": path,
                            "resumed_target": target, "resumed_host": host}


def on_keras(module: ModuleType) -> None:
    callbacks = module.callbacks
    backup = getattr(callbacks, "BackupAndRestore", None)
    if backup is not None and "_backup" not in backup.__dict__:  # Keras 3's own files
        _wrap(backup, "on_train_begin", _backup_begin)
        _wrap(backup, "_save_model", _keras_save)
    if backup is not None:  # tf_keras': a CheckpointManager's (hooked as TensorFlow's)
        _wrap(backup, "on_train_end", _backup_end)
    checkpoint = getattr(callbacks, "ModelCheckpoint", None)
    if checkpoint is not None:
        _wrap(checkpoint, "_save_model", _keras_save)


def on_tensorflow(module: ModuleType) -> None:
    _wrap(module.train.CheckpointManager, "__init__", _manager_init)
    _wrap(module.train.CheckpointManager, "save", _manager_save)


HOOKS = {"keras": on_keras, "tf_keras": on_keras, "tensorflow": on_tensorflow}
