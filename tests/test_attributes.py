"""Every `module.name` of a launcher module names something the module defines.

A name that moved (`saves.step_of` after `step_of` went to runtime/steps.py)
fails only when its line runs, and an `except Exception` around it can hide
that for good. This test reads launcher/, examples/ and bench/ with `ast`
(nothing is imported: it takes a second and needs no TensorFlow), finds each
name bound to a launcher module (`import launcher.x.y as m`, `from
launcher.x import y`, `from . import y`, `import launcher.x`; in the module or
in a function, a local of the same name hiding it) and checks each `m.name`
read, and each `from launcher.x import name`, against what the module defines
at its top level: a def, a class, an assignment, an import, a name a function
declares `global`, a submodule of a package; a module with `__getattr__` or a
`from ... import *` defines anything.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("launcher", "examples", "bench")
# What every module has without defining it.
MODULE_DUNDERS = frozenset({"__file__", "__name__", "__doc__", "__path__", "__spec__",
                            "__loader__", "__package__", "__dict__", "__builtins__"})
ANYTHING = "*"
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def launcher_modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((root / "launcher").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def defined(modules: dict[str, Path], module: str) -> frozenset[str]:
    """The names `module` defines at its top level (ANYTHING among them: any name)."""
    submodules = frozenset(m.rpartition(".")[2] for m in modules
                           if m.rpartition(".")[0] == module)
    return _defined(modules[module], submodules)


@functools.cache
def _defined(path: Path, submodules: frozenset[str]) -> frozenset[str]:
    tree = _parsed(path)
    names = set(MODULE_DUNDERS) | submodules
    for node in _top_level(tree.body):
        names |= _bound_by(node)
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            names.add(ANYTHING)
    names |= {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}
    if "__getattr__" in names:
        names.add(ANYTHING)
    return frozenset(names)


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import: into if/try/with/for bodies, not into defs."""
    for node in body:
        yield node
        if isinstance(node, _SCOPES):
            continue
        for attr in ("body", "orelse", "finalbody"):
            yield from _top_level(getattr(node, attr, []))
        for handler in getattr(node, "handlers", []):
            yield from _top_level(handler.body)


def _bound_by(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Import | ast.ImportFrom):
        return {a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"}
    targets: list[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [node.target]
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _target(node: ast.Import | ast.ImportFrom, package: str) -> str:
    """The module `from X import ...` names (absolute)."""
    assert isinstance(node, ast.ImportFrom)
    if not node.level:
        return node.module or ""
    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class Checker:
    """The bad references of one file."""

    def __init__(self, root: Path, modules: dict[str, Path], path: Path) -> None:
        self.root, self.modules, self.path = root, modules, path
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        is_package = path.name == "__init__.py"
        self.package = name.removesuffix(".__init__") if is_package else name.rpartition(".")[0]
        self.found: list[str] = []

    def run(self) -> list[str]:
        tree = _parsed(self.path)
        top = list(_top_level(tree.body))
        aliases = self._imports(top)
        rebound = set().union(*(_bound_by(n) for n in top
                                if not isinstance(n, ast.Import | ast.ImportFrom)), set())
        self._visit(tree, {k: v for k, v in aliases.items() if k not in rebound})
        return self.found

    def _imports(self, statements: list[ast.stmt]) -> dict[str, str]:
        """Names these import statements bind to launcher modules (and checks
        each `from launcher.x import name`)."""
        aliases: dict[str, str] = {}
        for node in statements:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname and a.name in self.modules:
                        aliases[a.asname] = a.name
                    elif not a.asname and a.name.split(".")[0] == "launcher":
                        aliases["launcher"] = "launcher"
            elif isinstance(node, ast.ImportFrom):
                source = _target(node, self.package)
                if source not in self.modules:
                    continue
                for a in node.names:
                    full = f"{source}.{a.name}"
                    if full in self.modules:
                        aliases[a.asname or a.name] = full
                    elif a.name != "*":
                        self._check(source, a.name, node.lineno)
        return aliases

    def _check(self, module: str, name: str, line: int) -> None:
        names = defined(self.modules, module)
        if name not in names and ANYTHING not in names:
            rel = self.path.relative_to(self.root)
            self.found.append(f"{rel}:{line}: {module} has no {name!r}")

    def _resolve(self, node: ast.AST, aliases: dict[str, str]) -> str | None:
        """The launcher module `node` (a name or a dotted chain) stands for."""
        if isinstance(node, ast.Name):
            return aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            module = self._resolve(node.value, aliases)
            if module is not None and f"{module}.{node.attr}" in self.modules:
                return f"{module}.{node.attr}"
        return None

    def _visit(self, node: ast.AST, aliases: dict[str, str]) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            outer = [*getattr(node, "decorator_list", []), *node.args.defaults,
                     *(d for d in node.args.kw_defaults if d is not None)]
            for child in outer:
                self._visit(child, aliases)
            body = node.body if isinstance(node.body, list) else [node.body]
            statements = list(_in_scope(body))
            local = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
            local |= {n.id for n in statements
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            local |= set().union(*(_bound_by(s) for s in statements
                                   if isinstance(s, ast.stmt)), set())
            local -= {n for s in statements if isinstance(s, ast.Global | ast.Nonlocal)
                      for n in s.names}
            inner = {k: v for k, v in aliases.items() if k not in local}
            inner.update(self._imports([s for s in statements
                                         if isinstance(s, ast.Import | ast.ImportFrom)]))
            for child in body:
                self._visit(child, inner)
            return
        if isinstance(node, _COMPREHENSIONS):
            bound = {n.id for g in node.generators for n in ast.walk(g.target)
                     if isinstance(n, ast.Name)}
            aliases = {k: v for k, v in aliases.items() if k not in bound}
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            module = self._resolve(node.value, aliases)
            if module is not None and f"{module}.{node.attr}" not in self.modules:
                self._check(module, node.attr, node.lineno)
        for child in ast.iter_child_nodes(node):
            self._visit(child, aliases)


def _in_scope(body: list[ast.AST]) -> Iterator[ast.AST]:
    """Every node of a function's own scope, not those of the scopes in it
    (a nested def's name is its own, though)."""
    for node in body:
        yield node
        if isinstance(node, _SCOPES):
            continue
        yield from _in_scope([c for c in ast.iter_child_nodes(node)
                              if not isinstance(c, _COMPREHENSIONS)])


def bad_references(root: Path = REPO, scanned: tuple[str, ...] = SCANNED) -> list[str]:
    modules = launcher_modules(root)
    found: list[str] = []
    for folder in scanned:
        for path in sorted((root / folder).rglob("*.py")):
            found += Checker(root, modules, path).run()
    return sorted(set(found))


def test_every_module_attribute_is_defined_where_it_is_read():
    found = bad_references()
    assert not found, ("a name read from a launcher module that it does not define (it "
                       "moved, or was renamed: read it where it is now):\n"
                       + "\n".join(f"  {f}" for f in found))


def test_a_moved_name_is_caught(tmp_path: Path):
    files = {
        "launcher/__init__.py": "",
        "launcher/runtime/__init__.py": "from . import steps\n",
        "launcher/runtime/steps.py": "def step_of(x):\n    return x\n",
        "launcher/runtime/saves.py": "import os\n\n\ndef save():\n    pass\n",
        "launcher/runtime/memtier.py": (
            "from . import saves\nfrom . import steps as counted\n\n\n"
            "def merge(saves_=None):\n"
            "    try:\n        return saves.step_of(1)\n"  # line 7: moved
            "    except Exception:\n        return None\n\n\n"
            "def fine(story):\n"
            "    from .saves import gone\n"  # line 13: a lazy import of a moved name
            "    counted.step_of(2)\n"
            "    steps = [s for s in story]\n    return [saves.save, steps]\n\n\n"
            "def local(saves):\n    return saves.step_of\n"),  # a parameter: not the module
        "examples/train.py": ("import launcher.runtime.steps as st\nfrom launcher import "
                              "runtime\n\nst.step_of(1)\nruntime.steps.gone(1)\n"
                              "runtime.__file__\n"),
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert bad_references(tmp_path, ("launcher", "examples")) == [
        "examples/train.py:5: launcher.runtime.steps has no 'gone'",
        "launcher/runtime/memtier.py:13: launcher.runtime.saves has no 'gone'",
        "launcher/runtime/memtier.py:7: launcher.runtime.saves has no 'step_of'"]
