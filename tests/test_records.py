"""`mgpu-launch status` and `mgpu-launch logs` on real run directories.

The jobs are real launcher runs (`python -m launcher --local 2 ...`, real agents
and task processes) of a tiny script without TensorFlow that prints, reports
progress and waits for a file, so a run can be read while it is still going.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from launcher.commands.logs import resolve_task_logs
from launcher.outlets.rundir import launcher_alive, load_run
from tests.conftest import PYTHON, cli_env, read_events, run_cli, start_cli, wait_for

SCRIPT = """\
import os, sys, time
from pathlib import Path
from launcher import runtime

release = Path(sys.argv[1])
me = os.environ["MGPU_TASK_TYPE"] + os.environ["MGPU_TASK_INDEX"]
fail_as = sys.argv[2] if len(sys.argv) > 2 else ""
for step in range(1, 4):
    print(f"{me} line {step}", flush=True)
    runtime.report_progress(step, loss=1.0 / step)
if me == fail_as:
    print(f"{me} is about to fail", flush=True)
    sys.exit(3)
print(f"{me} waiting", flush=True)
deadline = time.monotonic() + 120  # never outlive a broken test
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print(f"{me} released", flush=True)
print(f"{me} partial-no-newline", end="", flush=True)
"""


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_cli(list(args), cwd=cwd, timeout=60)


def _steps(run_dir: Path) -> dict[str, int]:
    return {e["task"]: e["step"] for e in read_events(run_dir)
            if e["event"] == "progress" and "step" in e}


def test_status_and_logs_while_running_and_after(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    release = tmp_path / "release"
    run_dir = tmp_path / "run"
    job = start_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                     str(script), str(release)], cwd=tmp_path)
    follower = None
    try:
        def both_waiting() -> bool:
            logs = [run_dir / "logs" / f"host{i}-worker{i}.log" for i in (0, 1)]
            return (_steps(run_dir) == {"worker0": 3, "worker1": 3}
                    and all(p.exists() and "waiting" in p.read_text() for p in logs))

        wait_for(both_waiting, 60, "both tasks to print and report step 3")

        # --- while the job is running
        status = _cli("status", str(run_dir), cwd=tmp_path)
        assert status.returncode == 0, status.stderr
        assert "status:     running" in status.stdout
        rows = {line.split()[0]: line.split() for line in status.stdout.splitlines()
                if line.startswith("host")}
        assert rows["host0/worker0"][1:5] == ["worker", "0", "running", "3"]
        assert rows["host1/worker1"][1:5] == ["worker", "1", "running", "3"]
        assert "logs/host1-worker1.log" in rows["host1/worker1"][-1]

        as_json = json.loads(_cli("status", str(run_dir), "--json", cwd=tmp_path).stdout)
        assert as_json["status"] == "running" and as_json["generation"] == 0
        assert [(t["task"], t["state"], t["last_step"]) for t in as_json["tasks"]] == [
            ("host0/worker0", "running", 3), ("host1/worker1", "running", 3)]

        for spelling in ("worker1", "host1/worker1", "host1-worker1"):
            logs = _cli("logs", str(run_dir), spelling, cwd=tmp_path)
            assert logs.returncode == 0, logs.stderr
            assert logs.stdout.splitlines() == [
                "worker1 line 1", "worker1 line 2", "worker1 line 3", "worker1 waiting"]
        last = _cli("logs", str(run_dir), "worker0", "-n", "1", cwd=tmp_path)
        assert last.stdout == "worker0 waiting\n"

        # Follow every log; it must end by itself once the job finishes.
        followed = tmp_path / "followed.txt"
        with open(followed, "w") as sink:
            follower = subprocess.Popen(
                [PYTHON, "-m", "launcher", "logs", str(run_dir), "-f", "-n", "1"],
                cwd=tmp_path, env=cli_env(), stdout=sink, stderr=subprocess.STDOUT)
        wait_for(lambda: followed.read_text().count("waiting") == 2, 60,
                 "`logs -f` to print the last line of each log")
        release.touch()
        assert follower.wait(timeout=60) == 0, followed.read_text()
        lines = followed.read_text().splitlines()
        for i in (0, 1):
            label = f"host{i}/worker{i} | worker{i}"
            assert f"{label} waiting" in lines
            assert f"{label} released" in lines
            assert f"{label} partial-no-newline" in lines
        assert not any("line 1" in line for line in lines)  # -n 1: only the last line before

        job_out, _ = job.communicate(timeout=60)
        assert job.returncode == 0, job_out[-2000:]
    finally:
        release.touch()
        for proc in (job, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    # --- after the job
    status = _cli("status", str(run_dir), cwd=tmp_path)
    assert "status:     succeeded" in status.stdout
    assert f"summary:    {run_dir / 'summary.json'}" in status.stdout
    view = json.loads(_cli("status", str(run_dir), "--json", cwd=tmp_path).stdout)
    assert view["status"] == "succeeded" and view["restarts"] == 0
    assert [(t["state"], t["exit_code"]) for t in view["tasks"]] == [("succeeded", 0)] * 2
    everything = _cli("logs", str(run_dir), cwd=tmp_path).stdout.splitlines()
    assert "host1/worker1 | worker1 released" in everything
    assert everything[0] == "host0/worker0 | worker0 line 1"


def test_status_of_a_failed_run_names_the_root_cause(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(script), str(tmp_path / "never"), "worker1"], cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout[-2000:]

    status = _cli("status", str(run_dir), cwd=tmp_path)
    out = status.stdout
    assert "status:     failed" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("host")}
    assert rows["host1/worker1"][3:5] == ["failed", "3"]
    assert rows["host0/worker0"][3] == "stopped"  # torn down by the launcher, not a cause
    assert "root cause: host1/worker1 (host host1, generation 0) exited with code 3" in out
    assert "  worker1 is about to fail" in out  # its last lines
    assert _cli("logs", str(run_dir), "host1-worker1", "-n", "1",
                cwd=tmp_path).stdout == "worker1 is about to fail\n"
    # Following a finished run prints and returns at once.
    followed = _cli("logs", str(run_dir), "worker1", "-f", cwd=tmp_path)
    assert followed.returncode == 0 and followed.stdout.endswith("about to fail\n")


def test_usage_errors(tmp_path: Path):
    missing = _cli("status", str(tmp_path / "nope"), cwd=tmp_path)
    assert missing.returncode == 2 and "no such directory" in missing.stderr
    empty = _cli("logs", str(tmp_path), cwd=tmp_path)
    assert empty.returncode == 2 and "not a run directory" in empty.stderr


# ------------------------------------------------------- pure reading (no job)


def _write_run(run_dir: Path, events: list[dict]) -> None:
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events)
                                          + '{"t": 9, "event": "prog')  # a line being written


def test_replay_across_a_restart_and_a_dead_launcher(tmp_path: Path):
    now = time.time()
    tasks = [{"task": "worker0", "host": "a", "address": "10.0.0.1", "port": 1},
             {"task": "worker1", "host": "b", "address": "10.0.0.2", "port": 2}]
    _write_run(tmp_path, [
        {"t": now, "event": "launch", "generation": 0, "tasks": tasks},
        {"t": now, "event": "task_started", "generation": 0, "task": "worker0", "host": "a",
         "pid": 11},
        {"t": now, "event": "progress", "generation": 0, "task": "worker0", "host": "a",
         "step": 7, "loss": 0.5},
        {"t": now, "event": "task_exited", "generation": 0, "task": "worker1", "host": "b",
         "exit_code": None, "signal": 9, "stopped_by_launcher": False},
        {"t": now, "event": "failure_detected", "generation": 0, "task": "worker1", "host": "b",
         "kind": "signal", "exit_code": None, "signal": 9, "reason": "was killed by SIGKILL"},
        {"t": now, "event": "restart", "generation": 1, "restarts": 1, "backoff_s": 1},
        {"t": now, "event": "launch", "generation": 1, "tasks": tasks},
        {"t": now, "event": "task_started", "generation": 1, "task": "worker1", "host": "b",
         "pid": 12},
        {"t": now, "event": "host_lost", "generation": 1, "host": "a", "detail": "no heartbeat"},
        # A late message from generation 0 must not change generation 1's view.
        {"t": now, "event": "task_exited", "generation": 0, "task": "worker1", "host": "b",
         "exit_code": 1, "signal": None, "stopped_by_launcher": True},
    ])
    view = load_run(tmp_path, alive=lambda launch: None)
    assert view.status == "running" and view.generation == 1 and view.restarts == 1
    by_name = {t.name: t for t in view.tasks}
    assert by_name["worker0"].state == "lost" and by_name["worker0"].last_step == 7
    assert by_name["worker1"].state == "running" and by_name["worker1"].pid == 12
    assert [f["description"] for f in view.failures] == [
        "b/worker1 (host b, generation 0) was killed by SIGKILL"]
    assert load_run(tmp_path, alive=lambda launch: False).status == "aborted"
    assert resolve_task_logs(view, "b-worker1") == [("b/worker1", tmp_path / "logs" /
                                                      "b-worker1.log")]


def test_launcher_alive_checks_the_recorded_process(tmp_path: Path):
    host = "this-host"
    me = {"t": time.time(), "launcher_pid": os.getpid(), "launcher_host": host}
    assert launcher_alive(me, this_host=host) is True
    # The pid now belongs to a process started after the launch: reused, not ours.
    assert launcher_alive({**me, "t": time.time() - 10 ** 6}, this_host=host) is False
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    assert launcher_alive({**me, "launcher_pid": gone.pid}, this_host=host) is False
    assert launcher_alive({**me, "launcher_host": "elsewhere"}, this_host=host) is None
    assert launcher_alive({"t": 1.0}) is None
