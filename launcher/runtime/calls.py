"""A custom training loop's distributed calls, counted with no code in the script.

Workers of MultiWorkerMirroredStrategy must make the same distributed calls in
the same order. A custom loop has no `fit` whose phase and epoch tell where it
is (runtime/position.py), so this module counts its calls that take part in
collectives:

- `strategy.run` and `strategy.reduce` called eagerly count one each;
- a `tf.function` whose trace called `strategy.run` or `strategy.reduce` (the
  tutorial's `train_step`) is marked distributed, and each call of it counts
  one, counted as it begins (a worker waiting inside it has counted it).

The count, the last call's name and how often that one was called travel
with every progress report (`at_calls`, `at_call`, `at_call_n`) and the
launcher compares them (launcher/job/detect/lockstep.py): one worker in
`strategy.reduce()` while another is in `train_step` is a call made on one
worker only. The cost per call of a `tf.function`: one attribute read and,
when distributed, one increment.

Standard library only at import time; TensorFlow is reached only through the
module the hook receives. Must not import the launcher side.
"""

from __future__ import annotations

import functools
import importlib
import threading
from types import ModuleType

_MARK = "_mgpu_counts_calls"
_FLAG = "_mgpu_distributed"  # set on a tf.function whose trace made a distributed call

_inside = threading.local()  # the outermost tf.function running in this thread
_count = 0
_last = ""
_by_name: dict[str, int] = {}  # how often each was called: the rarer call is the odd one
_sent = 0  # the count in the last report


def fields() -> dict:
    """The count and the last call's name as progress fields ({} before any)."""
    global _sent
    _sent = _count
    if not _count:
        return {}
    return {"at_calls": _count, "at_call": _last[:60], "at_call_n": _by_name.get(_last, 0)}


def unsent() -> bool:
    """A call was made since the last report."""
    return _count != _sent


def _counted(name: str) -> None:
    global _count, _last
    _count += 1  # one thread makes a worker's distributed calls: no lock on the step path
    _last = name
    _by_name[name] = _by_name.get(name, 0) + 1


def _strategy_method(cls: type, name: str) -> None:
    original = cls.__dict__.get(name)
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        function = getattr(_inside, "function", None)
        if function is not None:
            setattr(function, _FLAG, True)  # traced inside a tf.function: it counts
        else:
            _counted(f"strategy.{name}()")
        return original(self, *args, **kwargs)

    setattr(method, _MARK, True)
    setattr(cls, name, method)


def _function_call(cls: type) -> None:
    original = cls.__dict__.get("__call__")
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __call__(self, *args, **kwargs):
        if getattr(_inside, "function", None) is not None:
            return original(self, *args, **kwargs)  # inside another: that one counts
        _inside.function = self
        known = getattr(self, _FLAG, False)
        if known:
            _counted(getattr(self, "_name", "tf.function"))
        try:
            return original(self, *args, **kwargs)
        finally:
            _inside.function = None
            if not known and getattr(self, _FLAG, False):  # its first call traced it
                _counted(getattr(self, "_name", "tf.function"))

    setattr(__call__, _MARK, True)
    cls.__call__ = __call__


def on_tensorflow(module: ModuleType) -> None:  # noqa: ARG001 - the private modules below
    strategies = importlib.import_module("tensorflow.python.distribute.distribute_lib")
    for name in ("run", "reduce"):
        _strategy_method(strategies.StrategyBase, name)
    functions = importlib.import_module(
        "tensorflow.python.eager.polymorphic_function.polymorphic_function")
    _function_call(functions.Function)


HOOKS = {"tensorflow": on_tensorflow}
