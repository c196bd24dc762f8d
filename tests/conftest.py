"""Shared helpers: run the real CLI in a subprocess and wait on events with a bound."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
EXAMPLES = REPO / "examples"
PYTHON = sys.executable

# A training script without TensorFlow for tests that watch a running job
# (metrics, `status --watch`): reports a step every 0.1 s until the release
# file (its first argument) exists.
PROGRESS_UNTIL_RELEASED = """\
import sys, time
from pathlib import Path
from launcher import runtime
release = Path(sys.argv[1])
deadline = time.monotonic() + 60  # never outlive a broken test
step = 0
while not release.exists() and time.monotonic() < deadline:
    step += 1
    runtime.report_progress(step, loss=1.0 / step)
    time.sleep(0.1)
"""


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"  # keep TF's start-up chatter out of test output
    env.update(extra)
    return env


def run_cli(args: list[str], cwd: Path, timeout: float = 300, **env: str
            ) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "launcher", *args], cwd=cwd, env=cli_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def start_cli(args: list[str], cwd: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=cwd, env=cli_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             interval: float = 0.05) -> object:
    """Poll `predicate` until it returns something truthy; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            pass  # a line being written right now
    return events


def read_summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def status_json(run_dir: Path) -> dict:
    """What a user reads of a run: `mgpu-launch status RUN_DIR --json`."""
    done = run_cli(["status", str(run_dir), "--json"], cwd=run_dir.parent, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def task_pids(run_dir: Path) -> dict[str, int]:
    return {e["task"]: e["pid"] for e in read_events(run_dir) if e["event"] == "task_started"}


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch folder to launch from (run and checkpoint dirs land here)."""
    return tmp_path


# The false alarms guarded over every real job of the suite: (marker that
# allows it, what marks it in events.jsonl, what it means).
_ALARMS = (
    ("straggler_expected", ('"event": "straggler"',), "the straggler radar named a task"),
    ("stuck_expected", ('"kind": "out_of_step"', '"event": "out_of_step_ahead"'),
     "workers were judged out of step (job/detect/lockstep.py)"),
)


@pytest.fixture(autouse=True)
def no_straggler_named(request):
    """The false-alarm guard over every real job the suite runs: no job a test
    started in its tmp_path names a straggler, unless the test is marked
    `straggler_expected` (it makes one, or writes one), nor calls its workers
    out of step, unless it is marked `stuck_expected`."""
    e2e = request.node.get_closest_marker("e2e") is not None \
        and "tmp_path" in request.fixturenames
    alarms = [a for a in _ALARMS if e2e and request.node.get_closest_marker(a[0]) is None]
    base = request.getfixturevalue("tmp_path") if alarms else None  # before it is torn down
    yield
    if base is None:
        return
    lines = [(path, line) for path in base.rglob("events.jsonl")
             for line in path.read_text(errors="replace").splitlines()]
    for _, marks, what in alarms:
        named = [f"{path}: {line.strip()}" for path, line in lines
                 if any(mark in line for mark in marks)]
        assert not named, f"{what} in a job with none:\n" + "\n".join(named)


def reported_steps(run_dir: Path, generation: int = 0) -> dict[str, list[int]]:
    """The steps each task of `generation` reported as progress, in order."""
    steps: dict[str, list[int]] = {}
    for event in read_events(run_dir):
        if event["event"] == "progress" and event.get("generation") == generation \
                and "step" in event:
            steps.setdefault(event["task"], []).append(int(event["step"]))
    return steps


def pytest_configure(config) -> None:
    """A suite started in the background by a non-interactive shell (`bash
    .ci/run &`) inherits SIGINT ignored, and so would every launcher a test
    starts: the Ctrl-C tests would send a signal nobody hears. With Python's
    own handler here, the processes the tests start get the default."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The launchers the tests start keep their code cache in the user's cache
    # (docs/ssh.md): in the suite's own, not root's.
    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="mgpu-suite-cache-")
