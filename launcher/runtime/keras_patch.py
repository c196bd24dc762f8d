"""What every fix of Keras 3's private code needs: the Keras in use (its
version, the lines the matrix proved), the job (multi-worker? the chief?), the
capability checks a fix makes before it patches (`expect_params`,
`source_of`; `CannotPatch` when the code moved), one-line announcements, and
the refusal that names what moved (`UntestedKerasError`, `refusal_message`).

Used by the fixes (runtime/keras_compat.py: the trainer and optimizer;
runtime/keras_savers.py: BackupAndRestore and ModelCheckpoint) and by the
JAX backend's (runtime/keras_jax.py). Standard library only; must not import
the launcher side.
"""

from __future__ import annotations

import json
import os
import sys

from ..strategy import DEFAULT as DEFAULT_STRATEGY
from ..strategy import Strategy

# Keras 3 lines the Keras matrix runs the e2e tests on (with TF 2.16, 2.19, 2.21).
PROVEN = ("3.3.", "3.10.", "3.15.")
MARK = "_mgpu_patched"  # on what a fix patched: patched once
_announced: set[str] = set()


class UntestedKerasError(RuntimeError):
    """Keras 3 `fit` under a multi-worker strategy, on a Keras whose private code moved."""


class CannotPatch(Exception):
    """The code a fix patches is not what it expects (its message says what moved)."""


def keras_version() -> str:
    """The installed Keras 3 version (`MGPU_KERAS_VERSION_OVERRIDE` wins, for tests)."""
    override = os.environ.get("MGPU_KERAS_VERSION_OVERRIDE")
    if override:
        return override
    try:
        from importlib import metadata

        return metadata.version("keras")
    except Exception:  # noqa: BLE001 - metadata may be missing in odd installs
        module = sys.modules.get("keras.src.version")
        return getattr(module, "__version__", "unknown")


def is_proven(version: str) -> bool:
    """A Keras line the matrix ran the e2e tests on (said in the announcement only)."""
    return version.startswith(PROVEN)


def multi_worker_job() -> bool:
    """A task of a job whose workers train in sync (MWMS over several workers)."""
    try:
        workers = int(os.environ.get("MGPU_NUM_WORKERS", "1"))
    except ValueError:
        workers = 1
    if workers <= 1:
        cluster = _tf_config().get("cluster", {})
        workers = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    return workers > 1 and os.environ.get("MGPU_STRATEGY", DEFAULT_STRATEGY) == (
        Strategy.MULTI_WORKER_MIRRORED
    )


def _tf_config() -> dict:
    try:
        return json.loads(os.environ.get("TF_CONFIG") or "{}")
    except ValueError:
        return {}


def is_chief() -> bool:
    config = _tf_config()
    task = config.get("task", {})
    kind, index = task.get("type", "worker"), int(task.get("index", 0))
    if kind == "chief" or not config:
        return True
    return kind == "worker" and index == 0 and not config.get("cluster", {}).get("chief")


def allow_unfixed() -> bool:
    return os.environ.get("MGPU_KERAS_UNTESTED") == "allow"


def announce(text: str) -> None:
    """Print one line about the Keras in use, once per text."""
    if text in _announced:
        return
    _announced.add(text)
    print(f"mgpu-launch: {text}", file=sys.stderr, flush=True)


def refusal_message(version: str, moved: list[str] | tuple[str, ...] = ()) -> str:
    what = "; ".join(moved) or "its private code moved"
    return (
        f"Keras {version}: mgpu-launch cannot fix Model.fit under "
        "MultiWorkerMirroredStrategy on this Keras; refusing rather than training wrongly. "
        "Fix: set `keras: tf_keras` and use tf.keras, or install a Keras the launcher "
        f"was proven on ({', '.join(p + 'x' for p in PROVEN)}; e.g. keras==3.15.*). "
        f"What moved: {what}. Why: upstream Keras 3 fit is broken under this strategy "
        "(keras-team/keras#20585) and mgpu-launch's fix reaches into private Keras code. "
        "Other ways out: a custom training loop (strategy.run), or, at your own risk, "
        "MGPU_KERAS_UNTESTED=allow to run this Keras without the fixes that cannot apply."
    )


# ------------------------------------------------------------ capability checks


def source_of(obj: object) -> str:
    import inspect  # here, as in params_of: the bootstrap imports this module in every task

    try:
        return inspect.getsource(obj)  # type: ignore[arg-type]
    except (OSError, TypeError):
        return ""  # no source shipped: the bug cannot be confirmed


def params_of(func: object, what: str) -> list[str]:
    if not callable(func):
        raise CannotPatch(f"{what} is gone")
    import inspect

    try:
        return list(inspect.signature(func).parameters)
    except (TypeError, ValueError) as exc:
        raise CannotPatch(f"{what} has no readable signature") from exc


def expect_params(func: object, expected: tuple[str, ...], what: str) -> None:
    params = params_of(func, what)
    if tuple(params) != expected:
        raise CannotPatch(f"{what}({', '.join(params)}) is not {what}({', '.join(expected)})")
