"""Detached runs: `--detach`, `status`/`logs` on them, `stop RUN_DIR`, and
`simulate --detach` letting go of the caller's pipe.

Real launcher processes (`--local 2`) running a tiny script without TensorFlow.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PYTHON, alive, cli_env, read_summary, run_cli, wait_for

# Prints, reports progress, and waits for the release file. On SIGTERM it
# "saves" until the release file exists (at most 2.5 s, within the default 3 s
# grace), so a stop stays under way as long as a test needs.
SCRIPT = """\
import os, signal, sys, time
from pathlib import Path
from launcher import runtime

def slow_exit(signum, frame):
    print("saving before exit", flush=True)
    deadline = time.monotonic() + 2.5
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(0)

signal.signal(signal.SIGTERM, slow_exit)
release = Path(sys.argv[1])
me = os.environ["MGPU_TASK_TYPE"] + os.environ["MGPU_TASK_INDEX"]
runtime.report_progress(1, loss=1.0)
print(f"{me} waiting", flush=True)
deadline = time.monotonic() + 120  # never outlive a broken test
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"{me} released", flush=True)
"""


@pytest.fixture
def job_script(workdir: Path) -> Path:
    script = workdir / "job.py"
    script.write_text(SCRIPT)
    return script


def _cli(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_cli(list(args), cwd=cwd, timeout=timeout)


def _status(run_dir: Path, cwd: Path) -> dict:
    result = _cli("status", str(run_dir), "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _detach(run_dir: Path, script: Path, release: Path, cwd: Path, *options: str,
            **env: str) -> subprocess.CompletedProcess:
    return run_cli(["--detach", "--local", "2", *options, "--run-dir", str(run_dir),
                    str(script), str(release)], cwd=cwd, timeout=60, **env)


# Put first on PYTHONPATH, it holds the background launcher of `--detach` (the
# only process started with MGPU_DETACHED_RUN_DIR set) before any of its code
# runs, until the gate file exists.
HOLD = """\
import os, time
if os.environ.get("MGPU_DETACHED_RUN_DIR") and os.environ.get("MGPU_TEST_GATE"):
    deadline = time.monotonic() + 120  # never outlive a broken test
    while not os.path.exists(os.environ["MGPU_TEST_GATE"]) and time.monotonic() < deadline:
        time.sleep(0.02)
"""


def _held(workdir: Path, gate: Path) -> dict[str, str]:
    """The environment that holds the background launcher until `gate` exists."""
    hook = workdir / "hold"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD)
    return {"PYTHONPATH": os.pathsep.join([str(hook), cli_env()["PYTHONPATH"]]),
            "MGPU_TEST_GATE": str(gate)}


def _launcher_pid(run_dir: Path) -> int:
    return int((run_dir / "launcher.pid").read_text().split()[0])


def _running(run_dir: Path, cwd: Path) -> bool:
    view = _status(run_dir, cwd)
    return view["status"] == "running" and \
        [t["state"] for t in view["tasks"]] == ["running", "running"]


def _cleanup(run_dirs: list[Path], release: Path) -> None:
    release.touch()
    for run_dir in run_dirs:
        try:
            pid = _launcher_pid(run_dir)
        except (OSError, ValueError, IndexError):
            continue
        if alive([pid]) and not (run_dir / "summary.json").exists():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def test_detach_returns_at_once_and_status_and_logs_follow_the_run(workdir: Path,
                                                                   job_script: Path):
    run_dir, release, gate = workdir / "run", workdir / "release", workdir / "gate"
    try:
        # It returns at once: while its background launcher is held before its
        # first line of code, so it waited for nothing the launcher does.
        result = _detach(run_dir, job_script, release, workdir, "--metrics-port", "0",
                         **_held(workdir, gate))
        assert result.returncode == 0, result.stderr
        # The run dir alone on stdout, absolute: `RUN=$(...)` works from any directory.
        assert result.stdout.splitlines() == [str(run_dir)]
        assert f"mgpu-launch stop {run_dir}" in result.stderr
        assert f"mgpu-launch logs {run_dir} -f" in result.stderr
        # The port chosen for --metrics-port 0 is said, and is the one served.
        url = re.search(r"metrics: (http://127\.0\.0\.1:\d+/metrics)", result.stderr)
        assert url, result.stderr
        for name in ("launcher.out", "launcher.pid"):
            assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
        pid = _launcher_pid(run_dir)
        assert alive([pid])

        # Right away (the launcher is still held: it has written nothing yet) and
        # once the tasks run.
        assert sorted(p.name for p in run_dir.iterdir()) == ["launcher.out", "launcher.pid"]
        assert _status(run_dir, workdir)["status"] == "running"
        gate.touch()
        wait_for(lambda: _running(run_dir, workdir), 60, "both tasks running")
        status = _cli("status", str(run_dir), cwd=Path("/"))  # from anywhere
        assert f"metrics:    {url[1]}" in status.stdout, status.stdout
        with urllib.request.urlopen(url[1], timeout=10) as page:
            assert "mgpu_task_state" in page.read().decode()
        assert _status(run_dir, workdir)["metrics_url"] == url[1]
        follower = subprocess.Popen([PYTHON, "-m", "launcher", "logs", str(run_dir), "-f"],
                                    cwd=workdir, env=cli_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
        release.touch()
        followed, _ = follower.communicate(timeout=60)  # ends by itself with the job
        assert "host1/worker1 | worker1 released" in followed, followed
        wait_for(lambda: _status(run_dir, workdir)["status"] == "succeeded", 60,
                 "status to say succeeded")
        wait_for(lambda: not alive([pid]), 30, "the detached launcher to exit")
        out = (run_dir / "launcher.out").read_text()
        assert "job succeeded" in out and "Traceback" not in out
        assert "worker1 released" not in out  # task output is in logs/, not twice
    finally:
        gate.touch()
        _cleanup([run_dir], release)


def test_stop_ends_a_detached_job_gracefully_once(workdir: Path, job_script: Path):
    run_dir, release = workdir / "run", workdir / "release"
    try:
        result = _detach(run_dir, job_script, release, workdir)
        assert result.returncode == 0, result.stderr
        wait_for(lambda: _running(run_dir, workdir), 60, "both tasks running")

        def stop() -> subprocess.Popen:
            return subprocess.Popen([PYTHON, "-m", "launcher", "stop", str(run_dir)],
                                    cwd=workdir, env=cli_env(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)

        first = stop()
        assert first.stdout.readline().startswith(f"stopping {run_dir}: SIGTERM sent to the "
                                                  "launcher")
        # The tasks are "saving" until the release file exists: a second stop comes.
        second = stop()
        line = second.stdout.readline()
        assert "a stop is already under way" in line and "without signalling again" in line
        release.touch()
        for proc in (first, second):
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, out + err
            assert out.startswith(f"{run_dir}: job interrupted by SIGTERM after "), out

        summary = read_summary(run_dir)
        assert summary["status"] == "interrupted" and summary["interrupted_by"] == 15
        # The tasks had their grace period: they were not killed.
        logs = [(run_dir / "logs" / f"host{i}-worker{i}.log").read_text() for i in (0, 1)]
        assert all("saving before exit" in log for log in logs)
        assert all(t["state"] == "stopped" and t["signal"] is None
                   for t in summary["tasks"].values()), summary["tasks"]

        finished = _cli("stop", str(run_dir), cwd=workdir)
        assert finished.returncode == 0
        assert finished.stdout.strip() == (
            f"{run_dir}: the job already finished: interrupted by SIGTERM after "
            f"{summary['wall_s']:.1f} s (0 restarts); nothing to stop")
    finally:
        _cleanup([run_dir], release)


def test_stop_of_a_run_whose_launcher_died_and_of_no_run(workdir: Path, job_script: Path):
    run_dir, release = workdir / "run", workdir / "release"
    try:
        result = _detach(run_dir, job_script, release, workdir)
        assert result.returncode == 0, result.stderr
        wait_for(lambda: _running(run_dir, workdir), 60, "both tasks running")
        pid = _launcher_pid(run_dir)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not alive([pid]), 30, "the launcher to die")
        gone = _cli("stop", str(run_dir), cwd=workdir)
        assert gone.returncode == 1
        assert "is gone and wrote no summary.json" in gone.stderr
        assert len(gone.stderr.strip().splitlines()) == 1
        assert _status(run_dir, workdir)["status"] == "aborted"
    finally:
        _cleanup([run_dir], release)
    nothing = _cli("stop", str(workdir / "nope"), cwd=workdir)
    assert nothing.returncode == 2 and "no such directory" in nothing.stderr


def test_detach_with_a_bad_config_fails_in_the_foreground(workdir: Path):
    bad = workdir / "cluster.yaml"
    bad.write_text("name: x\nhosts: []\n")
    (workdir / "train.py").write_text("print('hi')\n")
    result = _cli("--detach", "--run-dir", str(workdir / "run"), str(bad), "train.py",
                  cwd=workdir)
    assert result.returncode == 2, result.stdout + result.stderr
    assert not (workdir / "run").exists()


SSHD = os.environ.get("MGPU_SSHD", "/usr/sbin/sshd")


def test_simulate_detach_lets_go_of_the_callers_pipe(workdir: Path):
    # .ci/run installs openssh-server: without sshd this fails, it is not skipped.
    assert os.path.exists(SSHD), f"no sshd at {SSHD}: apt-get install openssh-server"
    sim = workdir / "sim"
    command = (f"{shlex.quote(PYTHON)} -m launcher simulate 2 --dir {shlex.quote(str(sim))} "
               "--detach | tail -3")
    try:
        result = subprocess.run(command, shell=True, cwd=workdir, env=cli_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "simulate stop --dir" in result.stdout
        pids = [int(p.read_text().split()[0]) for p in sim.glob("host*/sshd.pid")]
        assert len(pids) == 2 and len(alive(pids)) == 2  # still serving after the pipe closed
    finally:
        stopped = _cli("simulate", "stop", "--dir", str(sim), cwd=workdir)
    assert stopped.returncode == 0 and "stopped 2 simulated host(s)" in stopped.stdout
    wait_for(lambda: not alive(pids), 30, "the simulated sshds to exit")
    shutil.rmtree(sim, ignore_errors=True)
