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
  `MGPU_TF_HEARTBEAT_S` is set (`runtime.guards`).

Shipped to hosts; standard library and the runtime only. Must not import the
launcher side.
"""

from __future__ import annotations

import json
import os
import runpy
import sys


def _write_error(exc: BaseException) -> None:
    path = os.environ.get("MGPU_ERROR_FILE")
    if not path:
        return
    import traceback  # only on the way out: keep the start of every task light

    frames = traceback.extract_tb(exc.__traceback__)
    # Hide this module's own frames: the user's code starts below runpy.
    frames = [f for f in frames
              if not f.filename.endswith(("bootstrap.py", "runpy.py", "<frozen runpy>"))]
    record = {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "traceback": "".join(traceback.format_list(frames[-12:]))[-6000:],
    }
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
    except OSError:
        pass


def install_hooks() -> None:
    from launcher.runtime import guards, hooks, keras_compat, keras_jax

    for name, hook in keras_compat.HOOKS.items():
        hooks.when_imported(name, hook)
    if keras_jax.active():  # Keras 3 on JAX: coordinator timeouts, chief-only writes
        for name, hook in keras_jax.HOOKS.items():
            hooks.when_imported(name, hook)
    for name, hook in guards.HOOKS.items():
        if name == guards.COLLECTIVE and not guards.several_workers():
            continue  # the heartbeat matters only between several workers
        hooks.when_imported(name, hook)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m launcher.bootstrap SCRIPT [ARGS...]")
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    install_hooks()
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        _write_error(exc)
        raise


if __name__ == "__main__":
    main()
