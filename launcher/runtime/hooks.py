"""Post-import hooks: run a function on a module right after it is first imported.

Owns the `sys.meta_path` finder the bootstrap installs so that the runtime can
adjust TensorFlow and Keras (see `keras_compat` and `guards`) without importing
them itself: a task that never imports Keras 3 never pays for it, and a script
that sets `TF_USE_LEGACY_KERAS` or `TF_CPP_MIN_LOG_LEVEL` before importing
TensorFlow keeps working, since nothing is imported ahead of the script.

Standard library only. Must not import the launcher side, TensorFlow or Keras.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from types import ModuleType

Hook = Callable[[ModuleType], None]


# Plain classes, not importlib.abc subclasses: the import system only calls
# the methods, and importlib.abc costs ~9 ms of every task's start.
class _HookedLoader:
    """Delegates to the real loader, then runs the hook on the fresh module."""

    def __init__(self, loader, hook: Hook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._hook(module)

    def __getattr__(self, name: str):  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class PostImportFinder:
    """Finds nothing itself: wraps the loader the other finders return."""

    def __init__(self) -> None:
        self.hooks: dict[str, list[Hook | Deferred]] = {}
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        hooks = self.hooks.get(fullname)
        if not hooks or getattr(self._busy, "name", None) == fullname:
            return None
        self._busy.name = fullname  # the other finders may recurse into find_spec
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.name = None
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, _run_all(hooks))
        return spec


class Deferred:
    """The hook `HOOKS[key]` of the runtime module `source`, imported only when
    it is to run: a task whose script never imports what the hook watches never
    loads `source` (the bootstrap registers these; ~12 ms of every task's start).
    With `when`, only if `when()` says so then (else nothing is imported)."""

    def __init__(self, source: str, key: str, when: Callable[[], bool] | None = None) -> None:
        self.source, self.key, self.when = source, key, when
        self.__qualname__ = f"{source}.HOOKS[{key!r}]"  # named so in a warning until resolved

    def resolve(self) -> Hook | None:
        if self.when is not None and not self.when():
            return None
        __import__(self.source)
        return sys.modules[self.source].HOOKS[self.key]


def _call(hook: Hook | Deferred, module: ModuleType) -> None:
    resolved = hook.resolve() if isinstance(hook, Deferred) else hook
    if resolved is not None:
        resolved(module)


def _run_all(hooks: list[Hook | Deferred]) -> Hook:
    def run(module: ModuleType) -> None:
        for hook in hooks:
            name = getattr(hook, "__qualname__", repr(hook))
            try:
                if isinstance(hook, Deferred):
                    hook = hook.resolve()
                    if hook is None:
                        continue
                    name = getattr(hook, "__qualname__", repr(hook))
                hook(module)
            except Exception as exc:  # noqa: BLE001 - never break the script's import
                # A hook adjusts private TensorFlow/Keras code that may have
                # moved; the script then runs as the library ships it.
                print(f"mgpu-launch: warning: {name} skipped on {module.__name__} "
                      f"({type(exc).__name__}: {str(exc)[:160]})", file=sys.stderr, flush=True)

    return run


_finder: PostImportFinder | None = None


def when_imported(name: str, hook: Hook | Deferred) -> None:
    """Run `hook(module)` once `name` is imported (at once if it already is)."""
    global _finder
    module = sys.modules.get(name)
    if module is not None:
        _call(hook, module)
        return
    if _finder is None:
        _finder = PostImportFinder()
        sys.meta_path.insert(0, _finder)
    _finder.hooks.setdefault(name, []).append(hook)


def wrap_method(cls: object, name: str, make: Callable, mark: str) -> None:
    """Replace `cls.<name>` by `make(original)` once (`mark`: the wrapper's own
    attribute, so two hooks may each wrap the same method, once each)."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, mark, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, mark, True)
    setattr(cls, name, wrapper)
