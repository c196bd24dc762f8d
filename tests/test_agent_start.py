"""The agent's start on a host: `python -S -m launcher.agent`, real processes.

The agent runs without `site` (a fan-out pays every millisecond of its start
once per host) yet must still report the packages the host's interpreter has,
and must not fail a host whose TensorFlow only a `.pth` file puts on the path.
Neither the agent's start nor a task's (the bootstrap around the script) may
import a heavy standard-library module: `-X importtime` lists what they load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.sshcluster import make_venv

REPO = Path(__file__).resolve().parent.parent


def site_packages(python: Path) -> Path:
    done = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip())


def agent_hello(python: Path, tmp_path: Path, *args: str,
                flags: tuple[str, ...] = ()) -> tuple[dict, subprocess.CompletedProcess]:
    """Start the agent as the transports do (with the interpreter's `flags`
    too), close its stdin at once, return its hello."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [str(python), "-S", *flags, "-m", "launcher.agent", "--host", "h1",
         "--run-dir", str(tmp_path / "run"), "--eof-grace", "0", *args],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    hellos = [m for m in lines if m.get("ev") == "hello"]
    return (hellos[0] if hellos else {}), done


def test_versions_come_from_the_venvs_site_packages_without_running_pth_files(tmp_path):
    python = make_venv(tmp_path / "venv", {"tensorflow": "9.9.1", "keras": "3.99.0",
                                            "psutil": "7.0.0"})
    marker = tmp_path / "pth-ran"
    # A .pth line starting with `import` is executed by site.main(): it must not be.
    (site_packages(python) / "probe.pth").write_text(
        f"import pathlib; pathlib.Path({str(marker)!r}).touch()\n")
    hello, done = agent_hello(python, tmp_path)
    assert done.returncode == 0, done.stderr
    assert hello["packages"] == {"tensorflow": "9.9.1", "keras": "3.99.0", "tf_keras": None}
    assert hello["psutil"] is True
    assert hello["python"] == str(python)
    assert not marker.exists()
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o700


def test_tensorflow_that_only_a_pth_file_reaches_is_found(tmp_path):
    python = make_venv(tmp_path / "venv")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tensorflow-9.9.2.dist-info").mkdir(parents=True)
    (site_packages(python) / "elsewhere.pth").write_text(f"{elsewhere}\n")
    hello, done = agent_hello(python, tmp_path)
    assert done.returncode == 0, done.stderr
    assert hello["packages"]["tensorflow"] == "9.9.2"


def test_a_venv_without_tensorflow_reports_none(tmp_path):
    hello, done = agent_hello(make_venv(tmp_path / "venv"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert hello["packages"] == {"tensorflow": None, "keras": None, "tf_keras": None}
    assert hello["psutil"] is False


def test_bad_arguments_are_refused_with_the_usage(tmp_path):
    hello, done = agent_hello(Path(sys.executable), tmp_path, "--eof-grace", "soon")
    assert done.returncode != 0 and hello == {}
    assert "usage: python -m launcher.agent" in done.stderr
    assert "--eof-grace wants seconds, got 'soon'" in done.stderr


def test_site_dirs_are_the_folders_site_main_would_add(tmp_path):
    # For this interpreter, a venv of it, and a venv that sees the system's packages.
    made = []
    for name, extra in (("venv", []), ("system-venv", ["--system-site-packages"])):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", *extra,
                        str(tmp_path / name)], check=True)
        made.append(tmp_path / name / "bin" / "python")
    probe = ("import os, sys; from launcher.agent.hostfacts import site_dirs; ours = site_dirs(); "
             "import site; site.main(); "
             "theirs = [p for p in sys.path if p.endswith(('site-packages', 'dist-packages')) "
             "and os.path.isdir(p)]; "
             "print(ours == theirs, ours, theirs)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(REPO)
    for python in [Path(sys.executable), *made]:
        done = subprocess.run([str(python), "-S", "-c", probe], capture_output=True, text=True,
                              env=env, timeout=60)
        assert done.stdout.startswith("True "), (python, done.stdout, done.stderr)


# Standard-library modules that cost milliseconds to import (dataclasses pulls
# inspect, ast, dis and tokenize: ~12 ms of CPU), which every host's agent would
# pay at every launch: the agent's parts must not need them to start.
HEAVY = {"dataclasses", "inspect", "typing", "ast", "dis", "tokenize", "argparse",
         "logging", "hashlib", "shutil", "tempfile", "importlib.metadata", "email",
         "ipaddress", "pathlib", "uuid", "random", "base64", "zlib", "datetime"}


def imported(stderr: str) -> set[str]:
    """The modules `python -X importtime` listed."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines()
            if line.startswith("import time:")}


def test_the_agents_start_imports_no_heavy_module(tmp_path):
    hello, done = agent_hello(Path(sys.executable), tmp_path, flags=("-X", "importtime"))
    assert done.returncode == 0 and hello, done.stderr
    modules = imported(done.stderr)
    assert "launcher.agent.peercopy" in modules and "subprocess" in modules
    assert not HEAVY & modules, f"the agent's start imports {sorted(HEAVY & modules)}"


def _imports(argv: list[str], env: dict[str, str], cwd: Path, pass_fds=()) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60, pass_fds=pass_fds)
    assert done.returncode == 0, done.stderr
    assert "ran 1" in done.stdout
    return imported(done.stderr)


def test_a_tasks_start_imports_no_heavy_module_beyond_the_bare_scripts(tmp_path):
    """The bootstrap around a trivial script, with the environment an agent gives
    a worker of a 2-worker job, against the script alone (pdsh's task): what it
    adds must be light (its hooks load when what they watch is imported)."""
    script = tmp_path / "trivial.py"
    script.write_text("import sys\nprint('ran', len(sys.argv))\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "MGPU_", "TF_", "KERAS"))}
    bare = _imports([str(script)], env, tmp_path)
    progress_read, progress_write = os.pipe()
    cluster = {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    env.update({
        "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}),
        "MGPU_NUM_WORKERS": "2", "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "1",
        "MGPU_STRATEGY": "multi_worker_mirrored", "MGPU_KERAS": "auto",
        "MGPU_SAVE_FREQ": "epoch", "MGPU_TF_HEARTBEAT_S": "15",
        "MGPU_CHECKPOINT_DIR": str(tmp_path / "ckpt"), "MGPU_RUN_DIR": str(tmp_path),
        "MGPU_STACKS_FILE": str(tmp_path / "stacks.txt"),
        "MGPU_ERROR_FILE": str(tmp_path / "error.json"),
        "MGPU_PROFILE_REQUEST": str(tmp_path / "profile.request"),
        "MGPU_TASK_TOKEN": "0123456789abcdef", "MGPU_PROGRESS_FD": str(progress_write),
    })
    try:
        task = _imports(["-m", "launcher.bootstrap", str(script)], env, tmp_path,
                        pass_fds=(progress_write,))
    finally:
        os.close(progress_read)
        os.close(progress_write)
    added = task - bare
    assert "launcher.runtime.hooks" in added
    heavy = added & (HEAVY | {"json", "signal", "enum", "re"})
    assert not heavy, f"a task's start imports {sorted(heavy)}"
