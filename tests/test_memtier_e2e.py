"""Checkpoints at memory speed (`checkpoint: {memory: true}`), for real: two
TensorFlow workers of TF's custom-loop tutorial save into host memory while a
throttled FUSE mount (tests/slowfs.py, 20 MB/s) stands in for a busy shared
filesystem; a worker is killed with SIGKILL after a save, the restart restores
from memory, and the final weights equal an uninterrupted run's. Each worker's
checkpoint holds a variable of its own (WORKER_STATE), so worker1's save is
not the chief's: each save of the chief is copied through the launcher into
host1's memory."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from launcher.agent.memcopy import job_folder
from tests.conftest import SCRIPTS, read_events, read_summary, run_cli, start_cli, wait_for
from tests.slowfs import mounted
from tests.test_faults import Job, jobs, launch  # noqa: F401 - `jobs` is a fixture
from tests.test_strategies import explain

SCRIPT = str(SCRIPTS / "tutorial_ctl_big.py")


def config(path: Path, checkpoint_dir: Path, memory: bool) -> Path:
    path.write_text(
        "transport: local\n"
        f"checkpoint: {{dir: {checkpoint_dir}, memory: {str(memory).lower()}, "
        "memory_copies: 2}\n"
        "restart: {backoff_s: 0}\n"
        "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    return path


def final_digest(stdout: str) -> str:
    found = re.findall(r"FINAL ([0-9a-f]{64})", stdout)
    assert len(found) == 1, stdout[-3000:]
    return found[0]


@pytest.mark.e2e
def test_a_killed_worker_restores_from_memory_and_ends_with_an_uninterrupted_runs_weights(
        workdir: Path):
    plain = workdir / "plain-ckpt"
    # The uninterrupted run, memory off, beside the other (the test's time).
    baseline = start_cli(["--run-dir", str(workdir / "base"),
                          str(config(workdir / "base.yaml", plain, memory=False)),
                          SCRIPT, str(plain), "256", "3"], cwd=workdir)
    try:
        with mounted(str(workdir / "backing"), str(workdir / "shared"), 20) as shared:
            copy = memory_run(workdir, Path(shared))
        base_out, _ = baseline.communicate(timeout=120)
    finally:
        baseline.kill()
    assert baseline.returncode == 0, base_out[-4000:]
    assert "checkpoints saved in memory" not in base_out  # off: nothing hooked
    assert final_digest(base_out) == final_digest((workdir / "memory.out").read_text())
    # Removed at the job's end, on both hosts.
    folders = [job_folder(str(workdir / "run" / "hosts" / h), h) for h in ("host0", "host1")]
    assert copy.startswith(tuple(folders)), (copy, folders)  # the restore read one of them
    assert not [f for f in folders if os.path.exists(f)], folders


def memory_run(workdir: Path, shared: Path) -> str:
    """The memory run: worker 1 killed after epoch 1's save; checked as it ends."""
    ckpt = shared / "ckpt"
    run_dir = workdir / "run"
    result = run_cli(["--run-dir", str(run_dir),
                      str(config(workdir / "memory.yaml", ckpt, memory=True)),
                      SCRIPT, str(ckpt), "256", "3"], cwd=workdir, timeout=150, KILL_AT="1",
                     WORKER_STATE="1")
    assert result.returncode == 0, explain(result)
    (workdir / "memory.out").write_text(result.stdout)
    assert "checkpoints saved in memory" in result.stdout, explain(result)
    # The restart read the newest save from memory, the same on both workers.
    events = read_events(run_dir)
    [resumed] = [e for e in events if e["event"] == "resumed"]
    told = {e["task"]: (e["resumed"], e.get("resumed_from")) for e in events
            if e["event"] == "progress" and e["generation"] == 1 and "resumed" in e}
    assert told == {"worker0": (20, "memory"), "worker1": (20, "memory")}, told
    assert resumed["step"] == 20 and resumed["copy"]["from"] == "memory", resumed
    assert "resumed at step 20 (from memory on" in result.stdout, explain(result)
    assert read_summary(run_dir)["restarts"] == 1
    # worker1's saves differ from the chief's (its own variable): each of the chief's
    # went to host1's memory through the launcher, none was taken as covered.
    copies = [e for e in events if e["event"] == "memory_copy"]
    assert len(copies) >= 3 and all(
        e["host"] == "host1" and e["bytes"] > 1_000_000 and not e.get("covered_by")
        and not e.get("error") for e in copies), copies
    # The shared directory holds complete checkpoints only, the last one named.
    names = sorted(os.listdir(ckpt))
    assert not [n for n in names if "mgpu-part" in n], names
    assert 'model_checkpoint_path: "ckpt-3"' in (ckpt / "checkpoint").read_text()
    assert {"ckpt-3.index", "ckpt-2.index"} <= set(names), names
    assert "ckpt-1.index" not in names  # max_to_keep=2, as the manager keeps it
    return resumed["copy"]["path"]


TUTORIAL = str(SCRIPTS / "tutorial_ctl_model_only.py")  # TF's, as written


@pytest.mark.e2e
def test_tfs_custom_loop_tutorial_as_written_sees_its_saves_and_a_kill_costs_one_restart(
        workdir: Path, jobs: list[Job]):  # noqa: F811 - `jobs` is a fixture
    """Issue 55: non-chief workers save into `workertemp_<n>` and remove it
    with `tf.io.gfile.rmtree`; with the tier on, that folder was never made
    (NotFoundError, 3 spurious restarts) and holds nothing of the save."""
    ckpt = workdir / "ckpt"
    memory = workdir / "memory.yaml"
    memory.write_text(f"transport: local\nports: {{base: auto}}\n"
                      f"checkpoint: {{dir: {ckpt}, memory: true}}\n"
                      "restart: {max_restarts: 3, backoff_s: 0}\n"
                      "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    job = launch(jobs, [str(memory), "--no-live", TUTORIAL, str(ckpt), "3", "list"], workdir)
    wait_for(lambda: [e for e in job.events("progress", generation=0, task="worker1")
                      if e.get("saved", 0) >= 20], timeout=180, what="worker 1's first save")
    os.kill(job.pids()[(0, "worker1")], signal.SIGKILL)  # after a save
    assert job.finish(timeout=180) == 0, job.output[-4000:]
    assert "checkpoints saved in memory" in job.output, job.output[-3000:]
    assert "NotFoundError" not in job.output, job.output[-4000:]
    assert read_summary(job.run_dir)["restarts"] == 1, job.output[-3000:]
    # What the worker saved is where it saved it, as without the tier: listed,
    # and the newest checkpoint named there readable.
    seen = re.findall(r"SCRATCH \[(.*)\] LATEST (\S+)", job.output)
    assert len(seen) >= 3, job.output[-3000:]  # a save an epoch, one at least replayed
    for files, latest in seen:
        assert f"'{latest}.index'" in files and "'checkpoint'" in files, (files, latest)
    assert not os.path.lexists(ckpt / "workertemp_1" / "ckpt")  # removed by the script
