"""TensorFlow's start-up noise: one line per task in the terminal, every line
in the log. Unit tests of launcher.job.lines.noise on lines TF 2.21 printed here,
then a real TensorFlow worker through the launcher."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launcher.job.lines.noise import NoiseFolder, is_startup_noise
from tests.conftest import SCRIPTS, run_cli

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795694175.522982   16704 port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results due to floating-point round-off errors",
    "I0000 00:00:1795694175.523284   16704 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "E0000 00:00:1795694190.072862   16704 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "2024-03-01 10:00:00.123456: I tensorflow/core/platform/cpu_feature_guard.cc:210] This "
    "TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions: AVX2 AVX512F FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    # A TF1 remote session's step cleanup (issue 57: dozens in a legacy job's terminal).
    "W0000 00:00:1796564940.450796   17072 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: ABORTED: Cleanup 53889123786200732 "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
]
NOT_NOISE = [
    "E0000 00:00:1795694190.072862   16704 coordination_service_agent.cc:332] Polled an error "
    "from coordination service (this can be an error from this or another task).",
    "Epoch 1/2",
    "mgpu-launch: Keras 3.15.1",
    "Traceback (most recent call last):",
    "W0000 00:00:1796564940.450796   17072 local_rendezvous.cc:412] Local rendezvous is "
    "aborting with status: UNAVAILABLE: failed to connect to all addresses",
]


def test_start_up_notices_are_noise_and_errors_are_not():
    assert [t for t in NOISE if not is_startup_noise(t)] == []
    assert [t for t in NOT_NOISE if is_startup_noise(t)] == []


def test_one_fold_line_per_task_and_start_before_its_first_other_line():
    folder = NoiseFolder()
    shown = [s for t in NOISE[:3] for s in folder.show("h/w0", t, "logs/h-w0.log")]
    assert shown == []
    assert folder.show("h/w1", "Epoch 1/2", "logs/h-w1.log") == ["Epoch 1/2"]
    assert folder.show("h/w0", "Epoch 1/2", "logs/h-w0.log") == [
        "… 3 lines of TensorFlow start-up messages in logs/h-w0.log", "Epoch 1/2"]
    assert folder.show("h/w0", NOISE[3], "logs/h-w0.log") == []  # later noise: log only
    assert folder.flush("h/w0", "logs/h-w0.log") == []
    # The next start folds anew; a task that printed nothing else says it at its exit.
    assert folder.show("h/w0", NOISE[0], "logs/h-w0.log") == []
    assert folder.flush("h/w0", "logs/h-w0.log") == [
        "… 1 line of TensorFlow start-up messages in logs/h-w0.log"]
    assert NoiseFolder(enabled=False).show("h/w0", NOISE[0], "x") == [NOISE[0]]


@pytest.mark.e2e
def test_a_tensorflow_worker_shows_one_line_of_start_up_noise(workdir: Path):
    run_dir = workdir / "run"
    done = run_cli(["--local", "1", "--run-dir", str(run_dir), str(SCRIPTS / "tf_hello.py")],
                   cwd=workdir, timeout=180, TF_CPP_MIN_LOG_LEVEL="0")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (log,) = (run_dir / "logs").glob("*.log")
    in_log = [line for line in log.read_text().splitlines() if is_startup_noise(line)]
    assert len(in_log) >= 3, log.read_text()  # kept whole in the log
    task_lines = [line for line in done.stdout.splitlines() if line.startswith("host0/worker0")]
    assert [line for line in task_lines if is_startup_noise(line.split("| ", 1)[1])] == []
    folds = [line for line in task_lines if "TensorFlow start-up messages" in line]
    assert len(folds) == 1, task_lines
    said = int(re.search(r"… (\d+) lines? of TensorFlow start-up messages in (\S+)",
                         folds[0]).group(1))
    assert 0 < said <= len(in_log)
    assert "run/logs/host0-worker0.log" in folds[0]
    assert any(line.endswith("| hello from 7") for line in task_lines), task_lines


def test_the_surviving_peers_cascade_is_one_line_after_the_root_cause(workdir: Path):
    """After a worker fails, its peer's traceback is a consequence: folded to
    one line at its exit, after the failure is said; the log keeps it all
    (issue 53 item 5)."""
    run_dir = workdir / "run"
    result = run_cli(["--local", "2", "--max-restarts", "0", "--no-live", "--run-dir",
                      str(run_dir), str(SCRIPTS / "peer_cascade.py"), str(workdir / "ready")],
                     cwd=workdir, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "host0/worker0 | worker0 is up" in output  # before the failure: shown
    assert "host1/worker1 | worker1 fails now" in output  # the failed task's own: shown
    assert "cascade line" not in output and "Traceback" not in output, output[-3000:]
    fold = re.search(r"^host0/worker0 \| … (\d+) lines after host1/worker1 failed "
                     r"\(its peers' cascade\) in (\S+)$", output, re.M)
    assert fold is not None and int(fold.group(1)) >= 31, output[-3000:]
    assert output.index("failure: host1/worker1") < fold.start(), output[-3000:]
    log = (run_dir / "logs" / "host0-worker0.log").read_text()
    assert "Traceback" in log and "cascade line 29" in log
    verbose = run_cli(["--local", "2", "--max-restarts", "0", "--no-live", "-v", "--run-dir",
                       str(workdir / "run2"), str(SCRIPTS / "peer_cascade.py"),
                       str(workdir / "ready2")], cwd=workdir, timeout=120)
    assert "cascade line 29" in verbose.stdout + verbose.stderr  # --verbose shows all
