"""Small and monomorphic (issue 20 item 7): no module of `launcher/` over 600
lines, no function over 60.

Reads every module with `ast` (nothing is imported: milliseconds). A module's
length is its number of lines; a function's runs from its `def` line to its
last line (decorators left out, docstring and comments counted); a nested
function counts on its own and inside the one around it. Each failure names
the file and line, the function and its length, so the fix starts there.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

@dataclass(frozen=True)
class TooLong:
    path: str  # relative to the repository
    line: int
    name: str  # the function's qualified name; "" for the module itself
    length: int

    def __str__(self) -> str:
        if not self.name:
            return f"{self.path}: module of {self.length} lines (limit {MAX_MODULE_LINES})"
        return (f"{self.path}:{self.line}: {self.name} is {self.length} lines "
                f"(limit {MAX_FUNCTION_LINES})")


def too_long(path: Path, root: Path = REPO) -> list[TooLong]:
    """Everything in one module over the limits, in file order."""
    rel = str(path.relative_to(root))
    source = path.read_text()
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(TooLong(rel, 1, "", lines))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        found.append(TooLong(rel, child.lineno, name, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, filename=rel), "")
    return found


def modules(root: Path = REPO) -> list[Path]:
    return sorted((root / "launcher").rglob("*.py"))


def test_no_module_or_function_is_too_long():
    found = [item for path in modules()
             for item in too_long(path)]
    assert not found, (
        "too long (issue 20 item 7: modules of a few hundred lines, functions that fit on "
        "a screen; split by concern):\n" + "\n".join(f"  {item}" for item in found))


def test_the_limits_are_measured_as_documented(tmp_path):
    (tmp_path / "launcher").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(59))
    path = tmp_path / "launcher" / "big.py"
    path.write_text(
        "@decorated\n"  # line 1: decorators are not counted
        f"def fits():\n{body}\n"  # lines 2-61: 60 lines, the limit
        "class Holder:\n"  # line 63
        "    async def method(self):\n"  # line 64
        + body.replace("    ", "        ") + "        return 1\n"  # to line 124: 61 lines
        + "\n" * (MAX_MODULE_LINES + 1 - 124))  # 601 lines in all
    assert [str(item) for item in too_long(path, tmp_path)] == [
        f"launcher/big.py: module of 601 lines (limit {MAX_MODULE_LINES})",
        f"launcher/big.py:64: Holder.method is 61 lines (limit {MAX_FUNCTION_LINES})"]
