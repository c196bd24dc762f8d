"""What `--local` (simulated hosts) needs on this machine before a job starts.

The launcher itself installs without TensorFlow (`pip install mgpu-launch`):
real hosts bring their own, and `mgpu-launch check` checks them. Simulated
hosts run the tasks here, with this machine's Python, so a missing TensorFlow
(or a package of the bundled examples) is found before anything starts and
named with the one command that installs it, instead of every task dying of a
`ModuleNotFoundError` and the job being restarted in vain.

Only packages that the project's extras provide are checked: a script's own
modules (beside it, or on a PYTHONPATH the tasks get) are none of our business.
Reads the script with `ast` and asks the tasks' Python with `find_spec` (which
finds a package without importing it). Imports nothing of the launcher.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from ..strategy import DEFAULT as DEFAULT_STRATEGY
from ..strategy import Strategy

# Top-level module -> (pip distribution, the extra of this project that installs it).
PROVIDED = {
    "tensorflow": ("tensorflow", "tf"),
    "tf_keras": ("tf-keras", "tf"),
    "keras": ("keras", "tf"),
    "sklearn": ("scikit-learn", "examples"),
    "tensorboard": ("tensorboard", "examples"),
    "jax": ("jax", "jax"),
}
# What every task imports: TensorFlow, or JAX for Keras 3 on JAX.
ALWAYS = {Strategy.KERAS_DISTRIBUTION: ("jax",)}
DEFAULT_ALWAYS = ("tensorflow",)
FIND = ("import importlib.util, json, sys\n"
        "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))")


def script_imports(script: Path) -> list[str]:
    """Top-level module names the script imports (any depth in its code); [] if unreadable."""
    try:
        tree = ast.parse(script.read_text(), filename=str(script))
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module.split(".")[0])
    return list(dict.fromkeys(names))


def missing(python: str, modules: Iterable[str]) -> list[str] | None:
    """The modules `python` cannot find; None when that Python cannot be asked."""
    wanted = list(modules)
    if not wanted:
        return []
    if python == sys.executable:  # this interpreter (--local's default): no process to start
        return [m for m in wanted if importlib.util.find_spec(m) is None]
    try:
        done = subprocess.run([python, "-c", FIND, *wanted], capture_output=True, text=True,
                              timeout=30)
        return list(json.loads(done.stdout)) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def local_problem(pythons: Iterable[str], script: Path,
                  strategy: str = DEFAULT_STRATEGY) -> str | None:
    """What to install before simulated hosts can run `script`, or None."""
    always = ALWAYS.get(strategy, DEFAULT_ALWAYS)
    modules = [*always, *(m for m in script_imports(script) if m in PROVIDED)]
    modules = list(dict.fromkeys(modules))
    for python in dict.fromkeys(pythons):
        lacking = missing(python, modules)
        if not lacking:  # None: a Python we cannot ask is left to the agent's own error
            continue
        extras = [PROVIDED[m][1] for m in lacking]
        extra = ",".join(e for e in ("examples", "tf", "jax") if e in extras
                         and not (e == "tf" and "examples" in extras))
        packages = ", ".join(PROVIDED[m][0] for m in lacking)
        pip = f"{python} -m pip" if python != sys.executable else "pip"
        return (f"--local runs the tasks on this machine with {python}, which lacks "
                f"{packages} (needed by {script.name}): install them with\n"
                f"  {pip} install 'mgpu-launch[{extra}]'\n"
                f"  (from a clone of the repository: {pip} install -e '.[{extra}]')")
    return None
