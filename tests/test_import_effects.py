"""Importing a launcher module changes nothing: no environment variable read
away, no working directory changed. (The launcher once popped
MGPU_DETACHED_RUN_DIR when `launcher.ops.control` was imported: whoever
imported it, a test or a tool, lost the variable.)

Each import runs in a fresh interpreter, so that what one module does is not
hidden by an earlier import. `launcher.runtime` is left out: it is the training
script's side and imports TensorFlow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PROBE = r"""
import importlib, os, pathlib, sys
repo = pathlib.Path(sys.argv[1])
names = sorted(
    ".".join(p.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
    for p in (repo / "launcher").rglob("*.py")
    if "runtime" not in p.relative_to(repo).parts)
before_env, before_cwd = dict(os.environ), os.getcwd()
changed = []
for name in names:
    importlib.import_module(name)
    if dict(os.environ) != before_env or os.getcwd() != before_cwd:
        changed.append(name)
        os.environ.clear(); os.environ.update(before_env); os.chdir(before_cwd)
print(len(names), *changed)
"""


def test_importing_launcher_modules_leaves_the_environment_alone(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "MGPU_DETACHED_RUN_DIR": str(tmp_path / "run"),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(REPO)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    count, *changed = done.stdout.split()
    assert int(count) > 30  # every module was imported, not a few
    assert changed == [], f"importing these changed os.environ or the cwd: {changed}"


def test_the_detached_launcher_still_takes_its_run_dir(tmp_path: Path):
    """The variable is taken when the CLI starts, not lost: tasks never see it."""
    code = ("import os, pathlib, sys\n"
            "from launcher.ops import control\n"
            "assert os.environ['MGPU_DETACHED_RUN_DIR']\n"
            "control.take_detached_run_dir()\n"
            "print('MGPU_DETACHED_RUN_DIR' in os.environ,"
            " control.is_detached_child(pathlib.Path(sys.argv[1])))\n")
    env = {"PATH": "/usr/bin:/bin", "MGPU_DETACHED_RUN_DIR": str(tmp_path / "run"),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
