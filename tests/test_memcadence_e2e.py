"""Saves more often than the script's (`checkpoint: {memory: true,
memory_interval: N}`), for real: TensorFlow's multi-worker Keras tutorial
(its own BackupAndRestore, a save each epoch of 40 steps) on two workers, one
killed with SIGKILL at step 75: the restart resumes within the memory interval
of where it was (step 70, not the script's step 40), its epoch runs only the
batches it had left, and the job ends on the run's step count. Beside it, a
tf_keras `fit` on one worker crashes at step 27 and resumes at step 25. While
they train, the agents' copies run on what the training leaves (`ps -L -o
ni,cls`): the copy to the directory niced, the copy to another host's memory
at SCHED_IDLE on both ends, and none of it on a job of one host."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_events, start_cli

TUTORIAL = str(SCRIPTS / "tutorial_backup.py")  # 6 epochs of 40 steps
ONE_FIT = str(SCRIPTS / "backup_fit_any_keras.py")  # 4 epochs of 16 steps


def config(path: Path, hosts: int, interval: int) -> Path:
    path.write_text(f"name: {path.stem}\ntransport: local\n"
                    f"checkpoint: {{memory: true, memory_interval: {interval}}}\n"
                    "restart: {backoff_s: 0}\n"
                    "hosts:\n" + "  - {address: 127.0.0.1}\n" * hosts)
    return path


SCHED_IDLE = 5


def agent_threads(run_dir: Path, host: str) -> set[tuple[int, int]]:
    """(nice, scheduling policy) of the threads of `host`'s agent in that run."""
    found: set[tuple[int, int]] = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if "launcher.agent" not in argv or argv[argv.index("--host") + 1] != host or \
                    not argv[argv.index("--run-dir") + 1].startswith(str(run_dir)):
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1]
                found.add((int(fields.split()[16]), int(fields.split()[38])))
        except (OSError, ValueError, IndexError):
            continue  # a process or thread that ended meanwhile
    return found


def threads_while_running(agents: dict[str, tuple], timeout: float) -> dict[str, set]:
    """Each agent's threads' (nice, policy) seen while its job ran, sampled."""
    seen: dict[str, set] = {name: set() for name in agents}
    deadline = time.monotonic() + timeout
    while any(proc.poll() is None for proc, _, _ in agents.values()) and \
            time.monotonic() < deadline:
        for name, (_proc, run_dir, host) in agents.items():
            seen[name] |= agent_threads(run_dir, host)
        time.sleep(0.1)
    return seen


def resumed_step(run_dir: Path) -> dict:
    [resumed] = [e for e in read_events(run_dir) if e["event"] == "resumed"]
    return resumed


@pytest.mark.e2e
def test_a_killed_worker_loses_at_most_the_memory_interval_not_the_scripts_epoch(
        workdir: Path):
    # The one-worker tf_keras run beside the two-worker one (the test's time).
    one = start_cli(["--run-dir", str(workdir / "one"), str(config(workdir / "one.yaml", 1, 5)),
                     ONE_FIT, str(workdir / "one-ckpt"), "tf_keras"], cwd=workdir,
                    CRASH_AT_STEP="27")
    two = start_cli(["--run-dir", str(workdir / "two"), str(config(workdir / "two.yaml", 2, 10)),
                     TUTORIAL, str(workdir / "backup")], cwd=workdir, KILL_AT_STEP="75")
    try:
        # The agents' threads, sampled while the jobs run (a copy's stay for the next).
        seen = threads_while_running({"one": (one, workdir / "one", "127.0.0.1"),
                                      "sender": (two, workdir / "two", "host0"),
                                      "receiver": (two, workdir / "two", "host1")}, 150)
        two_out, _ = two.communicate(timeout=150)
        one_out, _ = one.communicate(timeout=120)
    finally:
        two.kill()
        one.kill()
    assert two.returncode == 0, two_out[-4000:]
    alone, sender, receiver = seen["one"], seen["sender"], seen["receiver"]
    assert (19, 0) in alone and (0, 0) in alone, alone  # the copier niced, the rest not
    assert not [t for t in alone if t[1] == SCHED_IDLE], alone  # one host: no peer copy
    assert (19, 0) in sender and (19, SCHED_IDLE) in sender, sender  # chief's host: sends
    assert (19, SCHED_IDLE) in receiver and (0, 0) in receiver, receiver
    assert "a save to memory every 10 steps for Keras BackupAndRestore" in two_out
    assert "ModelCheckpoint and a custom loop's CheckpointManager keep" in two_out
    assert re.search(r"checkpoints in memory: a copy is [\d.]+ [kM]B", two_out), two_out[-3000:]
    resumed = resumed_step(workdir / "two")
    # Killed at step 75; the script's own last save was epoch 0's (step 40).
    assert 75 - 10 <= resumed["step"] <= 75 and resumed["epoch"] == 1, resumed
    assert resumed["copy"]["from"] == "memory", resumed
    # The resumed epoch ran the 10 batches it had left: 6 x 40 steps in all, each worker.
    assert two_out.count("STEPS_DONE 240") == 2, two_out[-3000:]

    assert one.returncode == 0, one_out[-4000:]
    resumed = resumed_step(workdir / "one")
    assert resumed["step"] == 25 and resumed["epoch"] == 1, resumed  # not 16: epoch 0's end
    assert "STEPS_DONE 64" in one_out, one_out[-3000:]
