"""Runs the user's training script inside a task: `python -m launcher.bootstrap SCRIPT ARGS`.

Owns what must happen in the task process before and around the user's code:
- the script runs as `__main__` with `sys.argv` and `sys.path[0]` exactly as
  `python SCRIPT ARGS` would set them, so an unmodified script works;
- an uncaught exception is written (type, message, traceback) to
  `MGPU_ERROR_FILE`, so the launcher can name the root cause without asking
  the user to decorate their code;
- post-import hooks (nothing is imported ahead of the script) that make Keras
  3 `Model.fit` work under MultiWorkerMirroredStrategy on tested Keras
  versions and refuse on others (`runtime.keras_compat`), say which Keras the
  task uses, stop a worker of a multi-worker job that builds a single-host
  strategy, and shorten TensorFlow's coordination heartbeat when
  `MGPU_TF_HEARTBEAT_S` is set (`runtime.guards`), and count the training
  steps of any Keras `fit` or custom loop from its optimizer (`runtime.steps`),
  and keep the task's phase and epoch, and a custom loop's distributed calls,
  for the launcher to compare when the workers fall out of step
  (`runtime.position`, `runtime.calls`); report every checkpoint save
  (`runtime.saves`) and where a restarted task resumed (`runtime.restores`),
  passing over a checkpoint that cannot be read (`runtime.readable`),
  and a TF1 session forming and its global step (`runtime.sessions`),
  and a loss that goes non-finite at its step (`runtime.sentinel`);
- warm starts: `python -m launcher.bootstrap --standby` imports TensorFlow,
  waits for its task on stdin and then goes on exactly as above
  (`launcher.standby`);
- a task with TensorFlow loaded that dies of an uncaught exception exits
  without the interpreter's module teardown (`exit_quickly`: threads joined,
  atexit handlers run, open files flushed, as at a normal exit), ~1 s sooner:
  its peers' next generation waits for its exit; in a multi-process JAX
  task without JAX's exit barrier, where its peers wait for it
  (`_leave_jax_cluster`);
- a program that ended cleanly says so (`ProgramOver`, after every exit
  handler): the launcher need not wait for the interpreter's teardown; with
  TensorFlow or JAX loaded it then collects once and freezes the garbage
  collector's objects: that teardown takes 0.2-0.4 s, not 1-3 s
  (`_skip_final_collections`);
- Python stacks on demand: `faulthandler` dumps every thread's stack into
  `MGPU_STACKS_FILE` (set by the agent) on `MGPU_STACKS_SIGNAL` (a name or a
  number; default SIGUSR1; `off` disables). The agent sends that signal
  before a hung job is torn down. A script that installs its own handler
  for the signal later replaces this one (its stacks can then not be taken).

Shipped to hosts; standard library and the runtime only. Must not import the
launcher side.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

STACKS_SIGNAL_DEFAULT = "SIGUSR1"
STANDBY_FLAG = "--standby"  # launcher.standby.FLAG (the agent imports this module at start)
_STACKS_OFF = frozenset({"off", "none", "no", "false", "0"})
# Signals the launcher needs for itself (stop, continue), that cannot be
# caught, or that faulthandler only takes through enable().
_UNFIT = frozenset({"SIGKILL", "SIGSTOP", "SIGTERM", "SIGCONT", "SIGCHLD", "SIGSEGV",
                    "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL"})


def stacks_signal(value: str | None) -> int | None:
    """The signal number MGPU_STACKS_SIGNAL names (None: off); ValueError if bad.
    Shared with the agent, which must send the very signal the task listens on."""
    text = (value or "").strip() or STACKS_SIGNAL_DEFAULT
    if text.lower() in _STACKS_OFF:
        return None
    if text == STACKS_SIGNAL_DEFAULT:  # every task's start: signal.py's enums cost ~1 ms
        from _signal import SIGUSR1  # its C half, loaded with the interpreter

        return SIGUSR1
    import signal

    if text.isdigit():
        number = int(text)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "" if 0 < number < signal.NSIG else None
        if name is None:
            raise ValueError(f"MGPU_STACKS_SIGNAL={value!r}: no such signal")
    else:
        name = text.upper() if text.upper().startswith("SIG") else "SIG" + text.upper()
        member = signal.Signals.__members__.get(name)
        if member is None:
            raise ValueError(f"MGPU_STACKS_SIGNAL={value!r} is not a signal name or number "
                             "(e.g. SIGUSR1, USR2, 12) nor `off`")
        number = int(member)
    if name in _UNFIT:
        raise ValueError(f"MGPU_STACKS_SIGNAL={value!r}: {name} cannot be used for stacks "
                         "(pick SIGUSR1, SIGUSR2 or a real-time signal)")
    return number


def register_stacks() -> None:
    """Dump every thread's stack into MGPU_STACKS_FILE on MGPU_STACKS_SIGNAL."""
    path = os.environ.get("MGPU_STACKS_FILE")
    if not path:
        return
    try:
        signum = stacks_signal(os.environ.get("MGPU_STACKS_SIGNAL"))
    except ValueError as exc:
        print(f"mgpu-launch: {exc}; stack dumps are off", file=sys.stderr, flush=True)
        return
    if signum is None:
        return
    import faulthandler

    try:
        # O_APPEND: the agent truncates the file before each request, and a
        # plain offset would go on from the end of the previous dump.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        faulthandler.register(signum, file=fd, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError) as exc:
        print(f"mgpu-launch: no stack dumps on signal {signum}: {exc}", file=sys.stderr,
              flush=True)


def _write_error(exc: BaseException) -> None:
    path = os.environ.get("MGPU_ERROR_FILE")
    if not path:
        return
    import json  # only on the way out: keep the start of every task light
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    # Hide this module's own frames: the user's code starts below runpy.
    frames = [f for f in frames if not f.filename.endswith(
        ("bootstrap.py", "standby.py", "runpy.py", "<frozen runpy>"))]
    record = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_list(frames[-12:]))[-6000:],
        **_keras_era(frames),
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
    except OSError:
        pass


_TF_KERAS = ("tf.keras", "tensorflow.keras", "from tensorflow import keras")


def _keras_era(frames) -> dict[str, bool]:
    """Facts for `keras: auto` (launcher/job/policy/keras_fallback.py): the error was
    raised inside Keras 3's own code, and the script is tf.keras-era code
    (it names `tf.keras`), the signs of tf_keras code running under Keras 3."""
    keras = sys.modules.get("keras")
    version = str(getattr(keras, "__version__", ""))
    inside = bool(frames) and f"{os.sep}keras{os.sep}src{os.sep}" in frames[-1].filename
    facts = {"raised_in_keras3": version.startswith("3") and inside}
    try:
        with open(sys.argv[0], encoding="utf-8", errors="replace") as handle:
            text = handle.read(1_000_000)
        facts["script_uses_tf_keras"] = any(name in text for name in _TF_KERAS)
    except OSError:
        pass
    return {key: True for key, value in facts.items() if value}


# The modules each runtime module's hooks watch (its `HOOKS`' keys, in their
# order; tests/test_runtime_unit.py checks them): the hooks are registered
# by name (`hooks.Deferred`), and a runtime module is imported only when one of
# them is. A script that never imports TensorFlow or Keras loads none of them
# (~12 ms of CPU per task start, once per host on a fan-out).
_KERAS = ("keras", "tf_keras")
_KERAS_TF = (*_KERAS, "tensorflow")
_KERAS3_CALLBACKS = ("keras.src.callbacks.backup_and_restore",
                     "keras.src.callbacks.model_checkpoint")
WATCHED: dict[str, tuple[str, ...]] = {
    "keras_compat": ("keras.src.backend.tensorflow.trainer",
                     "keras.src.backend.tensorflow.optimizer", *_KERAS3_CALLBACKS,
                     "tf_keras.src.engine.training"),
    "keras_jax": ("jax.distributed", *_KERAS3_CALLBACKS),
    "guards": ("tensorflow.python.distribute.mirrored_strategy",
               "tensorflow.python.distribute.one_device_strategy",
               "tensorflow.python.distribute.collective_all_reduce_strategy",
               "tensorflow.python.training.server_lib"),
    "steps": _KERAS,
    "saves": _KERAS_TF,
    "restores": _KERAS_TF,
    "readable": ("tensorflow",),
    "ownposition": ("tensorflow",),
    "sentinel": _KERAS,
    "position": _KERAS_TF,
    "calls": ("tensorflow",),
    "sessions": ("tensorflow",),
    "epochinput": ("tf_keras",),
    "epochinput3": ("keras.src.trainers.epoch_iterator", "keras.src.backend.tensorflow.trainer",
                    "keras.src.backend.jax.trainer", "keras.src.backend.torch.trainer",
                    "keras.src.callbacks.backup_and_restore"),
}
_COLLECTIVE = WATCHED["guards"][2]  # guards.COLLECTIVE
_KERAS_DISTRIBUTION = "keras_distribution"  # launcher.strategy's (its enum: not at every start)


def _watch(source: str, when: Callable[[], bool] | None = None,
           only: tuple[str, ...] = ()) -> None:
    """Register `source`'s hooks (those on `only` under `when`, the rest always)."""
    from launcher.runtime import hooks

    for name in WATCHED[source]:
        condition = when if not only or name in only else None
        hooks.when_imported(name, hooks.Deferred(f"launcher.runtime.{source}", name, condition))


def _several_workers() -> Callable[[], bool]:
    """`guards.several_workers()` of TF_CONFIG as it is now, asked when a hook
    runs (TensorFlow imported: json is loaded by then)."""
    tf_config, known = os.environ.get("TF_CONFIG"), []

    def several() -> bool:
        if not known:
            from launcher.runtime import guards

            known.append(guards.several_workers(tf_config or ""))
        return known[0]

    return several


def _wire_steps(steps) -> None:
    """The step counter's reports carry the saves timed since the last one, and
    `fit`'s first epoch tells where a restarted task resumed (runtime.steps):
    wired whenever the counter is loaded, by a hook or by anyone else."""
    from launcher.runtime import restores, saves

    steps.saves_pending, steps.first_epoch = saves.pending, restores.first_epoch


def _counting_steps() -> bool:
    """`steps.enabled()`, without loading it where its default holds."""
    if not os.environ.get("MGPU_PROGRESS_FD"):
        return False
    if not os.environ.get("MGPU_STEPS_EVERY_S", "").strip():
        return True  # steps.EVERY_S_DEFAULT (> 0)
    from launcher.runtime import steps

    return steps.enabled()


def install_hooks() -> None:
    from launcher.runtime import hooks

    _watch("keras_compat")
    if os.environ.get("MGPU_STRATEGY") == _KERAS_DISTRIBUTION:
        from launcher.runtime import keras_jax

        if keras_jax.active():  # Keras 3 on JAX: coordinator timeouts, chief-only writes
            _watch("keras_jax")
    several = _several_workers()
    # The heartbeat matters only between several workers.
    _watch("guards", when=several, only=(_COLLECTIVE,))
    hooks.when_imported("launcher.runtime.steps", _wire_steps)
    if _counting_steps():  # steps and steps/s from any script (the optimizer's counter)
        _watch("steps")
    # `checkpoint: {memory: true}`: saves to host memory (inside saves'). Its
    # modules (hashlib, shutil, copy: ~12 ms of CPU) only then: every task starts
    # through here, once per host on a fan-out. The variable is memtier.ENV_DIR.
    if os.environ.get("MGPU_MEMORY_DIR"):
        from launcher.runtime import memcadence, memtier

        if memcadence.enabled():  # `memory_interval`: extra saves (inside memtier's redirect)
            for name, hook in memcadence.HOOKS.items():
                hooks.when_imported(name, hook)
        for name, hook in memtier.HOOKS.items():
            hooks.when_imported(name, hook)
    # A custom loop's iterator in its checkpoint: each worker's own position (before
    # readable's: the restore it wraps reads the checkpoint readable chose).
    _watch("ownposition", when=several)
    if os.environ.get("MGPU_PROGRESS_FD"):  # checkpoint saves and restores: progress, resume
        _watch("saves")
        _watch("restores")
        _watch("readable")  # a damaged checkpoint passed over for the newest that reads
        _watch("sentinel")  # a loss gone non-finite, at the step (`sentinel: off`: none)
        _watch("sessions")  # TF1 sessions: one forming (joining), the global step
        # Phase, epoch and a custom loop's distributed calls (workers out of step).
        _watch("position", when=several)
        _watch("calls", when=several)
    # A resumed epoch's input continues where its save left it (tf_keras, Keras 3);
    # last: its BackupAndRestore._backup wraps saves' (a save it does not take is no save).
    _watch("epochinput")
    _watch("epochinput3")


def main() -> None:
    if sys.argv[1:] == [STANDBY_FLAG]:  # a standby: the task comes later (launcher.standby)
        from launcher.standby import wait_for_task

        sys.argv[1:] = wait_for_task()
    if len(sys.argv) < 2:
        sys.exit("usage: python -m launcher.bootstrap SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    register_stacks()
    install_hooks()
    if os.environ.get("MGPU_PROFILE_REQUEST"):  # traces on request (`mgpu-launch profile`)
        from launcher.runtime import trace

        trace.start_watching()
    import atexit

    over = ProgramOver()
    atexit.register(over)  # first registered: called last
    try:
        run_script(script)
    except SystemExit as exc:
        over.clean = exc.code in (None, 0)
        if over.clean:
            over.returned()
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _write_error(exc)
        in_jax_cluster = _leave_jax_cluster()
        if os.environ.get("MGPU_ERROR_FILE") and ("tensorflow" in sys.modules
                                                   or in_jax_cluster):
            sys.excepthook(type(exc), exc, exc.__traceback__)
            exit_quickly(1)
        raise
    over.clean = True
    over.returned()


def run_script(script: str) -> None:
    """`runpy.run_path(script, run_name="__main__")`, for a source file by its
    own steps but for `pkgutil`, whose import (with `typing`) is ~4 ms of CPU
    of every task's start: no importer for the path (not a folder or a zip),
    not compiled (.pyc): the source compiled under the name given and run by
    runpy in a fresh `__main__`, as run_path does. Anything else: run_path."""
    import io
    import runpy  # here: the agent imports this module for stacks_signal
    from importlib.util import MAGIC_NUMBER

    run_code = getattr(runpy, "_run_module_code", None)
    if run_code is None or _importer(script) is not None:
        runpy.run_path(script, run_name="__main__")
        return
    with io.open_code(os.path.abspath(script)) as handle:
        source = handle.read()
    if source[:len(MAGIC_NUMBER)] == MAGIC_NUMBER:
        runpy.run_path(script, run_name="__main__")
        return
    run_code(compile(source, script, "exec"), None, "__main__", pkg_name="", script_name=script)


def _importer(path: str):
    """`pkgutil.get_importer(path)`: the path hook that takes `path`, if any."""
    path = os.fsdecode(path)
    try:
        return sys.path_importer_cache[path]
    except KeyError:
        pass
    for hook in sys.path_hooks:
        try:
            importer = hook(path)
        except ImportError:
            continue
        sys.path_importer_cache.setdefault(path, importer)
        return importer
    return None


class ProgramOver:
    """Registered with atexit before the script runs, so called after every
    other exit handler (the script's, TensorFlow's): when the program ended
    cleanly (`clean`), it flushes the files the script left open and tells the
    launcher `{"over": 1}` on the progress channel. What is left then is the
    interpreter's teardown, where TensorFlow's coordination service may wait
    out a peer's heartbeat (15 s) before the process exits: the launcher ends a
    job whose every task is over (launcher/job/detect/tailcut.py)."""

    clean = False

    def returned(self) -> None:
        """The script's own code has ended cleanly (before any exit handler):
        only exit handlers and the teardown are left, so a task idle from here
        on may be cut (launcher/job/detect/tailcut.py); one idle inside its script never is."""
        _tell(b'{"returned": 1}\n')

    def __call__(self) -> None:
        if not self.clean or not os.environ.get("MGPU_PROGRESS_FD"):
            return
        _flush_open_files()
        _tell(b'{"over": 1}\n')
        _skip_final_collections()


def _skip_final_collections() -> None:
    """With TensorFlow (or JAX) loaded, the interpreter's teardown is mostly
    its garbage collector walking the ~390,000 objects it tracks, once per
    pass of the module teardown: 1.1-3.0 s after a small `fit`, where frozen
    it takes 0.2-0.4 s (a script timed side by side), and a synchronous job's
    end waits for every task's exit. One collection first (~0.2 s of CPU)
    finalizes the garbage there is now, the script's own globals included (a
    summary writer it never closed is flushed, as before); then `gc.freeze()`
    leaves the rest out of the teardown's collections. The teardown itself
    still runs (module attributes cleared, objects freed by their counts with
    their `__del__`, C++ destructors); only what becomes garbage in a
    reference cycle during it is left to the process's end, whose finalizers
    Python never promises at exit."""
    if "tensorflow" not in sys.modules and "jax" not in sys.modules:
        return
    import gc

    gc.collect()
    gc.freeze()


def _tell(line: bytes) -> None:
    """One line to the launcher on the progress channel, if there is one."""
    fd = os.environ.get("MGPU_PROGRESS_FD")
    if not fd:
        return
    try:
        os.write(int(fd), line)
    except (OSError, ValueError):
        pass


def _flush_open_files() -> None:
    """Files the script left open: their buffers reach disk (as at a normal exit)."""
    import gc

    # io's file objects and their subclasses all derive from io.IOBase's C
    # base; a check against io.IOBase itself (an ABC) walks its subclasses for
    # each new type: 145 ms of CPU over the ~380,000 objects of a process with
    # TensorFlow loaded, against 20 ms.
    from _io import _IOBase

    for obj in gc.get_objects():
        try:
            if isinstance(obj, _IOBase) and not obj.closed:
                obj.flush()
        except Exception:  # noqa: BLE001, S110 - a broken stream: as at a normal exit
            pass


def _leave_jax_cluster() -> bool:
    """In a multi-process JAX task, drop JAX's exit handler; True if there was one.

    JAX shuts its distributed client down at exit through a barrier that
    every process must reach: a process dying of an error waited there for
    peers that wait in a collective for it, until the launcher's hang timeout
    blamed one of them. Without it the process exits; its peers' collectives
    fail on the closed connection and the error is named where it happened."""
    distributed = sys.modules.get("jax._src.distributed")
    if getattr(getattr(distributed, "global_state", None), "client", None) is None:
        return False
    clean_up = getattr(sys.modules.get("jax._src.api"), "clean_up", None)
    if clean_up is None:
        return False
    import atexit

    atexit.unregister(clean_up)
    return True


def exit_quickly(code: int) -> None:
    """Exit as the interpreter does after an uncaught exception (non-daemon
    threads joined, atexit handlers run, open files flushed, the traceback
    already printed) but without its module teardown: with TensorFlow loaded
    that takes ~1 s, and a failed task's peers, torn down with it, wait for it
    before the next generation can take their ports."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)  # what Python's own exit waits for
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    _flush_open_files()
    os._exit(code)


if __name__ == "__main__":
    main()
