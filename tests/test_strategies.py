"""Each strategy end to end on simulated hosts: real launcher, real TensorFlow tasks.

MWMS with tf_keras over 2 workers x 2 logical CPU devices, a single-host
strategy caught in a multi-worker job, ParameterServerStrategy (chief + 2
workers + 1 ps) and the legacy TF1 `tf.train.Server` pattern (2 workers + 1 ps,
an unmodified script), plus the server module the PS workers run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, PYTHON, cli_env, read_summary, run_cli, wait_for

pytestmark = pytest.mark.e2e

STRATEGY_SCRIPTS = Path(__file__).resolve().parent / "scripts_strategies"


def write_config(path: Path, hosts: list[dict], **top: object) -> Path:
    """A local-transport cluster YAML (JSON is YAML) with auto ports."""
    config = {"name": path.stem, "transport": "local", "ports": {"base": "auto"},
              "restart": {"max_restarts": 0}, "hosts": hosts, **top}
    path.write_text(json.dumps(config))
    return path


def results(run_dir: Path) -> dict[str, dict]:
    """The `RESULT {...}` line each task printed, by log file stem (`h0-worker0`)."""
    out = {}
    for log in sorted((run_dir / "logs").glob("*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("RESULT "):
                out[log.stem] = json.loads(line[len("RESULT "):])
    return out


def explain(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.keras_matrix
def test_mwms_tf_keras_two_workers_by_two_logical_devices(workdir: Path):
    run_dir = workdir / "run"
    # tf.keras is tf_keras (`keras: auto` keeps TensorFlow's default: Keras 3).
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(STRATEGY_SCRIPTS / "replicas.py"), "--cpu-devices", "2"], cwd=workdir,
                     TF_USE_LEGACY_KERAS="1")
    assert result.returncode == 0, explain(result)
    found = results(run_dir)
    assert sorted(found) == ["host0-worker0", "host1-worker1"], explain(result)
    worker0, worker1 = found["host0-worker0"], found["host1-worker1"]
    assert worker0["replicas"] == worker1["replicas"] == 4
    assert len(worker0["local_devices"]) == 2
    assert worker0["weights"] == worker1["weights"]
    assert worker0["loss"] == worker1["loss"] and worker0["loss"][1] < worker0["loss"][0]
    assert "tf_keras 2." in result.stdout  # the bootstrap says which Keras trained


def test_single_host_strategy_in_a_multi_worker_job_is_caught(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(STRATEGY_SCRIPTS / "single_host.py")], cwd=workdir)
    assert result.returncode == 1, explain(result)
    cause = read_summary(run_dir)["root_cause"]["description"]
    assert "SingleHostStrategyError" in cause
    assert "MirroredStrategy" in cause and "MultiWorkerMirroredStrategy()" in cause
    assert "runtime.strategy()" in cause
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert "trained alone" not in logs


def test_a_second_multi_worker_strategy_in_one_process_is_refused(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--run-dir", str(run_dir),
                      str(STRATEGY_SCRIPTS / "strategy_twice.py")], cwd=workdir)
    assert result.returncode == 1, explain(result)
    cause = read_summary(run_dir)["root_cause"]
    assert cause["error"]["type"] == "StrategyCreatedTwiceError", cause
    assert "Create it once" in cause["error"]["message"]
    assert "run_training" in cause["error"]["traceback"]
    logs = "".join(p.read_text() for p in (run_dir / "logs").glob("*.log"))
    assert not [line for line in logs.splitlines() if line.startswith("never printed")]
    # Refused at the second creation: no collective ran, none died.
    assert "StartAbort" not in logs


def test_parameter_server_chief_two_workers_one_ps(workdir: Path):
    run_dir, ckpt = workdir / "run", workdir / "ckpt"
    config = write_config(
        workdir / "ps.yaml",
        [{"address": "127.0.0.1", "name": "h0", "roles": {"chief": 1, "ps": 1}},
         {"address": "127.0.0.1", "name": "h1", "roles": {"worker": 2}}],
        strategy="parameter_server", keras="tf_keras", checkpoint={"dir": str(ckpt)},
    )
    result = run_cli(["--run-dir", str(run_dir), str(config),
                      str(EXAMPLES / "strategies" / "parameter_server.py"),
                      "--epochs", "2", "--steps", "6"], cwd=workdir, timeout=400)
    assert result.returncode == 0, explain(result)
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["root_cause"] is None
    assert re.search(r"h0/chief0 +\| final loss [0-9.]+", result.stdout), explain(result)
    for server in ("h1-worker0", "h1-worker1", "h0-ps0"):  # stopped by the launcher
        assert "stopped" in (run_dir / "logs" / f"{server}.log").read_text()
    # Keras' TensorBoard callback wrote its event files (tensorboard is installed).
    assert list((ckpt / "tensorboard").rglob("events.out.tfevents.*"))


def test_server_module_serves_until_sigterm_then_exits_zero(tmp_path: Path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = cli_env(TF_CONFIG=json.dumps({"cluster": {"ps": [f"127.0.0.1:{port}"]},
                                        "task": {"type": "ps", "index": 0}}))
    proc = subprocess.Popen([PYTHON, "-m", "launcher.runtime.server"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        wait_for(lambda: lines, timeout=120, what="the serving line")
        assert f"ps0 serving at 127.0.0.1:{port}" in lines[0]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the gRPC server accepts connections
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
