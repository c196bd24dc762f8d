"""Failure kinds and transports are declared once, each in its table
(launcher/job/record/failkinds.py, launcher/spec/transports.py): no other module
compares their names as strings, or sets a failure's kind as one.

Reads the sources with `ast` (nothing is imported): milliseconds. A comparison
is one of a kind's (a transport's) names against an expression that mentions
`kind` or `failure` (`transport`); a kind set as a string is a `kind=` or
`failure=` keyword with a kind's name. docs/design.md, "A new failure kind",
"A new transport".
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from launcher.job.record.failkinds import KINDS, Kind
from launcher.spec.config import ClusterConfig
from launcher.spec.transports import NAMES, TRANSPORTS

REPO = Path(__file__).resolve().parent.parent
TABLES = {"launcher/job/record/failkinds.py", "launcher/spec/transports.py"}
KIND_NAMES = frozenset(k.value for k in Kind)
TRANSPORT_NAMES = frozenset(NAMES)
# What names a failure kind or a transport in an expression.
KIND_WORDS = re.compile(r"\bkind\b|failure|\.kind\b|_kind\b")
TRANSPORT_WORDS = re.compile(r"transport")


def _strings(node: ast.AST) -> set[str]:
    """The string constants `node` is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _found(tree: ast.AST, names: frozenset[str], words: re.Pattern[str],
           keywords: tuple[str, ...]) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for side in sides:
                named = _strings(side) & names
                others = " ".join(ast.unparse(s) for s in sides if s is not side)
                if named and words.search(others):
                    out.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.keyword) and node.arg in keywords \
                and _strings(node.value) & names:
            out.append((node.value.lineno, f"{node.arg}={ast.unparse(node.value)}"))
    return out


def _sources() -> list[Path]:
    return sorted(p for p in (REPO / "launcher").rglob("*.py")
                  if p.relative_to(REPO).as_posix() not in TABLES)


@pytest.mark.parametrize("what", ["failure kinds", "transports"])
def test_no_module_compares_the_names_of_a_table(what: str) -> None:
    names, words, keywords = ((KIND_NAMES, KIND_WORDS, ("kind", "failure"))
                              if what == "failure kinds"
                              else (TRANSPORT_NAMES, TRANSPORT_WORDS, ("transport",)))
    found = []
    for path in _sources():
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(REPO)}:{line}: {text}"
                  for line, text in _found(tree, names, words, keywords)]
    assert not found, (f"{what} compared or set by name outside their table: ask the "
                       "table (traits) or use its member instead:\n" + "\n".join(found))


def test_the_check_catches_a_comparison_and_a_kind_set_by_name() -> None:
    tree = ast.parse('if failure.kind == "hang": pass\n'
                     'fail(gen, record, kind="out_of_step")\n'
                     'x = config.transport in ("ssh", "local")\n'
                     'if fault == "hang": pass\n')  # a drill's fault, not a kind
    assert [line for line, _ in _found(tree, KIND_NAMES, KIND_WORDS, ("kind", "failure"))] \
        == [1, 2]
    assert [line for line, _ in _found(tree, TRANSPORT_NAMES, TRANSPORT_WORDS, ())] == [3]


def test_every_kind_and_transport_has_a_row_and_its_module() -> None:
    assert set(KINDS) == set(Kind)
    assert ClusterConfig.model_fields["transport"].annotation.__args__ == NAMES
    for name, traits in TRANSPORTS.items():
        module = REPO / "launcher" / "transport" / f"{traits.module}.py"
        tree = ast.parse(module.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "from_config"
                   for n in tree.body), f"{module}: no from_config for transport {name}"


def test_every_failure_kind_is_documented() -> None:
    text = (REPO / "docs" / "operations.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `failure_detected`"))
    missing = [k.value for k in Kind if f"`{k.value}`" not in row]
    assert not missing, f"docs/operations.md's failure_detected row lacks kinds {missing}"


def test_every_kinds_words_fill_in_from_their_fields() -> None:
    """Each template of the table names the fields a finding gives it (numbers
    where it formats one): a typo in a field's name fails here, not mid-run."""
    import string

    from launcher.job.record.failkinds import say

    for kind, traits in KINDS.items():
        for how, template in traits.words.items():
            fields = {name: (1.5 if spec else "x")
                      for _, name, spec, _ in string.Formatter().parse(template) if name}
            assert say(kind, how, fields), (kind, how)
    assert say(Kind.HANG, "silent", {"silent_s": 301.2, "limit_s": 300.0}) == (
        "made no progress for 301 s (no output, no progress report; "
        "restart.hang_timeout_s=300)")
