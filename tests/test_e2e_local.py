"""End to end on simulated local hosts: real agents, real TensorFlow workers, real faults."""

import os
import re
import signal
import stat
import time
from pathlib import Path

import psutil
import pytest

from launcher.transport.ports import ephemeral_range
from tests.conftest import (
    EXAMPLES,
    REPO,
    SCRIPTS,
    alive,
    read_events,
    read_summary,
    reported_steps,
    run_cli,
    start_cli,
    task_pids,
    wait_for,
)

pytestmark = pytest.mark.e2e


def test_example_trains_on_two_simulated_hosts(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--run-dir", str(run_dir),
                      str(EXAMPLES / "digits" / "train.py"), "--epochs", "6",
                      "--save", str(workdir / "digits.keras")], cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    accuracies = re.findall(r"^(host[01]/worker[01]) +\| test accuracy: ([0-9.]+)", out, re.M)
    assert sorted(label for label, _ in accuracies) == ["host0/worker0", "host1/worker1"]
    assert all(float(acc) > 0.85 for _, acc in accuracies), accuracies
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 0
    assert summary["root_cause"] is None
    assert {t["state"] for t in summary["tasks"].values()} == {"succeeded"}
    events = [e["event"] for e in read_events(run_dir)]
    assert events[0] == "launch" and events[-1] == "job_done"
    # `ports.base: auto`: outside the ephemeral range, which outgoing connections take from.
    first, last = ephemeral_range()
    ports = [t["port"] for t in read_events(run_dir)[0]["tasks"]]
    assert len(set(ports)) == 2 and not any(first <= p <= last for p in ports), ports
    assert events.count("task_started") == 2 and "progress" in events
    logs = sorted(p.name for p in (run_dir / "logs").iterdir())
    assert logs == ["host0-worker0.log", "host1-worker1.log"]
    assert "test accuracy" in (run_dir / "logs" / "host1-worker1.log").read_text()
    assert (run_dir / "config.yaml").exists()
    # Only the chief saved the model; TF_CONFIG files are private to the user.
    assert (workdir / "digits.keras").exists()
    tf_config_file = run_dir / "hosts" / "host1" / "tf_config" / "worker1.json"
    assert stat.S_IMODE(tf_config_file.stat().st_mode) == 0o600


def test_unmodified_tutorial_script_trains_to_identical_weights(workdir: Path):
    # Through the bundled cluster_configs/local.yaml (the --local path is above).
    run_dir = workdir / "run"
    result = run_cli(["--run-dir", str(run_dir), str(REPO / "cluster_configs" / "local.yaml"),
                      str(SCRIPTS / "tutorial_mwms.py"), str(workdir / "ckpt")], cwd=workdir)
    assert result.returncode == 0, result.stdout[-3000:]
    sums = re.findall(r"^(host[01]/worker[01]) +\| WEIGHTS_CHECKSUM ([0-9.]+)",
                      result.stdout, re.M)
    assert len(sums) == 2, result.stdout[-2000:]
    assert sums[0][1] == sums[1][1]
    # It never calls the runtime, yet its steps reach the launcher (the optimizer's
    # counter): 3 epochs of 10 steps, counted from the start of training.
    steps = reported_steps(run_dir)
    assert set(steps) == {"worker0", "worker1"}, steps
    assert all(s == sorted(s) and s[-1] == 30 for s in steps.values()), steps
    last = read_summary(run_dir)["tasks"]["host1/worker1"]["last_progress"]
    assert last["step"] == 30 and 0 < last["loss"] < 1.5, last  # Keras' loss at epoch end


def test_kill_9_of_a_worker_stops_the_peer_and_names_the_root_cause(workdir: Path):
    run_dir = workdir / "run"
    proc = start_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(EXAMPLES / "digits" / "train.py"), "--epochs", "200"], cwd=workdir)
    try:
        wait_for(lambda: {e["task"] for e in read_events(run_dir) if e["event"] == "progress"}
                 == {"worker0", "worker1"}, timeout=120, what="both workers training")
        pids = task_pids(run_dir)
        os.kill(pids["worker1"], signal.SIGKILL)
        killed_at = time.monotonic()
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - killed_at
    finally:
        proc.kill()
    output = proc.stdout.read()
    assert code == 1, output[-2000:]
    print(f"the launcher stopped {elapsed:.1f} s after the kill")
    summary = read_summary(run_dir)
    # The launcher stopped the peer (it did not wait for it to fail on its own).
    assert summary["tasks"]["host0/worker0"]["state"] == "stopped", summary["tasks"]
    cause = summary["root_cause"]
    assert cause["task"] == "host1/worker1" and cause["signal"] == 9
    assert "root cause: host1/worker1 (host host1, generation 0) killed (SIGKILL" in output
    assert alive(pids.values()) == []


def test_sigkill_of_the_launcher_leaves_no_process_behind(workdir: Path):
    run_dir = workdir / "run"
    proc = start_cli(["--local", "2", "--run-dir", str(run_dir),
                      str(EXAMPLES / "digits" / "train.py"), "--epochs", "200"], cwd=workdir)
    try:
        wait_for(lambda: len(task_pids(run_dir)) == 2, timeout=60, what="both tasks started")
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert len(family) >= 4  # two agents and two workers at least
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: alive(family) == [], timeout=30,  # ~2 s idle: EOF grace, task grace
                 what=f"every process of the job to exit (left: {alive(family)})")
    finally:
        proc.kill()


def test_ctrl_c_stops_everything_and_exits_130(workdir: Path):
    run_dir = workdir / "run"
    proc = start_cli(["--local", "2", "--run-dir", str(run_dir),
                      str(SCRIPTS / "fail_on_worker1.py")], cwd=workdir)
    try:
        wait_for(lambda: len(task_pids(run_dir)) == 2, timeout=60, what="both tasks started")
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        # worker1 fails on its own; restarts would follow: interrupt during them.
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        proc.kill()
    assert code == 130
    assert read_summary(run_dir)["status"] == "interrupted"
    wait_for(lambda: alive(family) == [], timeout=30, what="no process left")


def test_python_exception_is_the_root_cause_with_its_traceback(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(SCRIPTS / "fail_on_worker1.py")], cwd=workdir, timeout=60)
    assert result.returncode == 1
    cause = read_summary(run_dir)["root_cause"]
    assert cause["task"] == "host1/worker1" and cause["exit_code"] == 1
    assert cause["error"]["type"] == "FileNotFoundError"
    assert "load_settings" in cause["error"]["traceback"]
    assert "root cause: host1/worker1" in result.stdout
    assert "FileNotFoundError" in result.stdout


def test_busy_port_is_a_clear_error(workdir: Path):
    import socket

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        (workdir / "cluster.yaml").write_text(
            f"transport: local\nports: {{base: {port}}}\nhosts:\n  - {{address: 127.0.0.1}}\n")
        result = run_cli(["cluster.yaml", str(SCRIPTS / "fail_on_worker1.py")], cwd=workdir,
                         timeout=60)
    assert result.returncode == 2
    assert f"port(s) already in use on this machine: {port}" in result.stderr


def test_a_port_taken_before_tf_binds_it_restarts_free_on_fresh_ports(workdir: Path):
    """Worker 0's port is taken between the plan and TF's bind (the script holds
    it): `port_taken`, not the script's exception; the first is free of
    max_restarts and the restart takes fresh ports."""
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--max-restarts", "1", "--run-dir", str(run_dir),
                      str(SCRIPTS / "port_race.py")], cwd=workdir, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = read_events(run_dir)
    launches = [e for e in events if e["event"] == "launch"]
    held = launches[0]["tasks"][0]["port"]
    failure = next(e for e in events if e["event"] == "failure_detected")
    assert failure["kind"] == "port_taken" and failure["task"] == "worker0"
    assert (f"failure: host0/worker0 (host host0, generation 0) could not start: port {held} "
            "on host0 was taken before its task bound it") in result.stdout
    restart = next(e for e in events if e["event"] == "restart")
    assert restart["counted"] is False and restart["free"] == "port_taken"
    assert "the first port taken (not the script's bug), not counted" in result.stdout
    fresh = [t["port"] for t in launches[1]["tasks"]]
    assert held not in fresh, (held, fresh)
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1
    assert "all-reduced 2 over 2 replicas" in result.stdout
