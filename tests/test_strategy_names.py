"""Strategy names are compared in one place: launcher/strategy.py.

The launcher side compares `Strategy` members (or its COLLECTIVE / ON_JAX
sets), never a strategy's name spelled as a string, so a renamed or added
strategy is one edit. The shipped modules (runtime, agent: launcher/strategy.py
is shipped with them) compare the `MGPU_STRATEGY` a task was given with the
same members: every module but launcher/strategy.py is scanned.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from launcher.spec.config import ClusterConfig
from launcher.strategy import COLLECTIVE, ON_JAX, Strategy, framework

REPO = Path(__file__).resolve().parent.parent
NAMES = {s.value for s in Strategy}


def _spelled(node: ast.AST) -> bool:
    """A strategy's name as a string constant, alone or in a tuple/list/set."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_spelled(e) for e in node.elts)
    return False


def test_the_launcher_compares_no_strategy_name_as_a_string():
    found = []
    for path in sorted((REPO / "launcher").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel == "launcher/strategy.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            sides = ([node.left, *node.comparators] if isinstance(node, ast.Compare)
                     else [k for k in node.keys if k] if isinstance(node, ast.Dict) else [])
            if any(_spelled(side) for side in sides):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:70]}")
    assert not found, "compare with launcher.strategy.Strategy instead:\n" + "\n".join(found)


def test_the_cluster_file_accepts_exactly_the_strategies():
    accepted = set(typing.get_args(ClusterConfig.model_fields["strategy"].annotation))
    assert accepted == NAMES
    assert ClusterConfig.model_fields["strategy"].default == Strategy.MULTI_WORKER_MIRRORED


def test_a_member_is_its_yaml_name():
    assert Strategy("parameter_server") == "parameter_server"
    assert f"strategy {Strategy.KERAS_DISTRIBUTION}" == "strategy keras_distribution"
    assert "keras_distribution" in ON_JAX and "multi_worker_mirrored" in COLLECTIVE
    assert "parameter_server" not in COLLECTIVE
    assert framework("keras_distribution") == "JAX"
    assert framework("multi_worker_mirrored") == "TensorFlow"
