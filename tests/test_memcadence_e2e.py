"""Saves more often than the script's (`checkpoint: {memory: true,
memory_interval: N}`), for real, with both Kerases: TensorFlow's multi-worker
Keras tutorial (its own BackupAndRestore, a save each epoch of 40 steps) under
tf_keras on two workers, one killed with SIGKILL at step 75: the restart
resumes within the memory interval of where it was (step 70, not the script's
step 40), each worker from its own host's memory (tf_keras' non-chief worker
saves into `workertemp_1`, and leaves none in the backup directory), its epoch
runs only the batches it had left, and the job ends on the run's step count.
Beside it, Keras 3 on JAX (the distribution guide's shape, two processes on
one host) with one process killed with SIGKILL at step 47 resumes at step 45,
from memory, trains the batches its epoch had left, and ends on an
uninterrupted run's weights. While they train, the agents'
copies run on what the training leaves (`ps -L -o ni,cls`): the copy to the
directory niced, the work for another host's memory (each save's fingerprint,
and a copy sent or received) niced at SCHED_BATCH on both hosts, and none of
it on a job of one host."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_events, start_cli

TUTORIAL = str(SCRIPTS / "tutorial_backup.py")  # 6 epochs of 40 steps
ON_JAX = str(SCRIPTS / "tutorial_keras_jax_backup.py")  # 4 epochs of 20 steps


def config(path: Path, interval: int, extra: str, hosts: str) -> Path:
    path.write_text(f"name: {path.stem}\ntransport: local\n{extra}"
                    f"checkpoint: {{memory: true, memory_interval: {interval}}}\n"
                    "restart: {backoff_s: 0}\nhosts:\n" + hosts)
    return path


TWO_HOSTS = "  - {address: 127.0.0.1}\n" * 2
TF_KERAS = "env: {TF_USE_LEGACY_KERAS: '1'}\n"
JAX = "strategy: keras_distribution\nkeras: jax\n"


SCHED_BATCH = 3


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


def restored_from(run_dir: Path) -> dict[str, tuple[str, str, str]]:
    """Each restarted task's restore, as it told it: (from, host, copy)."""
    return {e["task"]: (e["resumed_from"], e["resumed_host"], e["resumed_copy"])
            for e in read_events(run_dir) if e["event"] == "progress"
            and e["generation"] == 1 and "resumed_from" in e}


@pytest.mark.e2e
def test_a_killed_worker_loses_at_most_the_memory_interval_not_the_scripts_epoch(
        workdir: Path):
    # The Keras 3 on JAX jobs of one host beside the tf_keras one (the test's time).
    jax_config = str(config(workdir / "one.yaml", 5, JAX,
                            "  - {address: 127.0.0.1, roles: {worker: 2}}\n"))
    one = start_cli(["--run-dir", str(workdir / "one"), jax_config, ON_JAX,
                     str(workdir / "one-ckpt")], cwd=workdir, KILL_AT_STEP="47")
    uninterrupted = start_cli(["--run-dir", str(workdir / "ref"), jax_config, ON_JAX,
                               str(workdir / "ref-ckpt")], cwd=workdir)
    two = start_cli(["--run-dir", str(workdir / "two"),
                     str(config(workdir / "two.yaml", 10, TF_KERAS, TWO_HOSTS)),
                     TUTORIAL, str(workdir / "backup")], cwd=workdir, KILL_AT_STEP="75")
    try:
        # The agents' threads, sampled while the jobs run (a copy's stay for the next).
        seen = threads_while_running({"one": (one, workdir / "one", "127.0.0.1"),
                                      "sender": (two, workdir / "two", "host0"),
                                      "receiver": (two, workdir / "two", "host1")}, 150)
        two_out, _ = two.communicate(timeout=150)
        one_out, _ = one.communicate(timeout=120)
        ref_out, _ = uninterrupted.communicate(timeout=120)
    finally:
        for job in (two, one, uninterrupted):
            job.kill()
    assert two.returncode == 0, two_out[-4000:]
    alone, sender, receiver = seen["one"], seen["sender"], seen["receiver"]
    assert (19, 0) in alone and (0, 0) in alone, alone  # the copier niced, the rest not
    assert not [t for t in alone if t[1] == SCHED_BATCH], alone  # one host: no peer copy
    assert (19, 0) in sender and (19, SCHED_BATCH) in sender, sender  # chief's host: sends
    assert (19, SCHED_BATCH) in receiver and (0, 0) in receiver, receiver
    assert "a save to memory every 10 steps for Keras BackupAndRestore" in two_out
    assert "ModelCheckpoint and a custom loop's CheckpointManager keep" in two_out
    assert re.search(r"checkpoints in memory: a copy is [\d.]+ [kM]B", two_out), two_out[-3000:]
    resumed = resumed_step(workdir / "two")
    # Killed at step 75; the script's own last save was epoch 0's (step 40).
    assert 75 - 10 <= resumed["step"] <= 75 and resumed["epoch"] == 1, resumed
    assert resumed["copy"]["from"] == "memory", resumed
    # Each worker from its own host's memory: its own save (tf_keras' worker 1
    # saves into workertemp_1), not the peer copy of the chief's, nor the directory.
    restored = restored_from(workdir / "two")
    assert {t: r[:2] for t, r in restored.items()} == {
        "worker0": ("memory", "host0"), "worker1": ("memory", "host1")}, restored
    assert "/worker1/s-" in restored["worker1"][2], restored
    assert not list((workdir / "backup").glob("**/workertemp_*"))  # none left behind
    # The resumed epoch ran the 10 batches it had left: 6 x 40 steps in all, each worker.
    assert two_out.count("STEPS_DONE 240") == 2, two_out[-3000:]

    assert one.returncode == 0, one_out[-4000:]
    resumed = resumed_step(workdir / "one")
    # Killed at step 47: at most the interval lost (45), not back to epoch 1's end (40).
    assert 47 - 5 <= resumed["step"] <= 47 and resumed["epoch"] == 2, resumed
    assert {r[0] for r in restored_from(workdir / "one").values()} == {"memory"}, one_out[-3000:]
    assert one_out.count("STEPS_DONE 80") == 2, one_out[-3000:]
    assert uninterrupted.returncode == 0, ref_out[-3000:]
    weights = set(re.findall(r"WEIGHTS (\S+)", one_out))
    assert weights == set(re.findall(r"WEIGHTS (\S+)", ref_out)) and len(weights) == 1, (
        one_out[-2000:], ref_out[-1000:])
