"""Importing a launcher module changes nothing: no environment variable read
away, no working directory changed. (The launcher once popped
MGPU_DETACHED_RUN_DIR when `launcher.commands.control` was imported: whoever
imported it, a test or a tool, lost the variable.)

Each import runs in a fresh interpreter, so that what one module does is not
hidden by an earlier import. `launcher.runtime` is left out: it is the training
script's side and imports TensorFlow.
"""

from __future__ import annotations

import json
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
            "from launcher.commands import control\n"
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


WORK_PROBE = r"""
import importlib, json, os, pathlib, signal, sys, threading
repo = pathlib.Path(sys.argv[1])
launcher_dir = str(repo / "launcher") + os.sep
names = sorted(
    ".".join(p.relative_to(repo).with_suffix("").parts).removesuffix(".__init__")
    for p in (repo / "launcher").rglob("*.py")
    if "runtime" not in p.relative_to(repo).parts)
reads = []


class Watched(type(os.environ)):
    # Every read of a variable, attributed to the launcher line that made it
    # (os.getenv and Mapping.get pass through os and collections.abc).
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in ("os", "collections.abc"):
            frame = frame.f_back
        if frame is not None and frame.f_code.co_filename.startswith(launcher_dir):
            where = os.path.relpath(frame.f_code.co_filename, repo)
            reads.append(f"reads ${key} ({where}:{frame.f_lineno})")
        return super().__getitem__(key)


os.environ.__class__ = Watched
valid = sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP})


def state():
    return {"threads": sorted(t.name for t in threading.enumerate()),
            "signal handlers": [str(signal.getsignal(s)) for s in valid],
            "sys.path": list(sys.path), "files here": sorted(os.listdir("."))}


work = {}
for name in names:
    before, reads[:] = state(), []
    importlib.import_module(name)
    after = state()
    done = reads + [f"changes {what}" for what in before if before[what] != after[what]]
    if done:
        work[name] = done
print(json.dumps({"count": len(names), "work": work}))
"""


def test_importing_launcher_modules_does_no_work(tmp_path: Path):
    """Beyond definitions, an import does nothing: no environment variable read
    (one set after the import must count, as MGPU_SSHD once did not for
    `simulate`), no thread started, no signal handler set, no sys.path changed,
    no file written."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "MGPU_SSHD": "/usr/sbin/sshd"}
    done = subprocess.run([sys.executable, "-c", WORK_PROBE, str(REPO)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["count"] > 30
    assert result["work"] == {}, f"importing these did work beyond definitions: {result['work']}"
