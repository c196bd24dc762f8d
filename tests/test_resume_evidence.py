"""The scripts people bring, judged from what they leave behind: their saves in
their own checkpoint directory and the step their restore left the optimizer
at (launcher/runtime/saves.py, restores.py; launcher/job/detect/resumes.py).

The scripts are shaped like TensorFlow's tutorials: their own backup or
checkpoint directory (not `checkpoint.dir`), no `runtime` calls. The faults are
real kill -9s of worker 1, each after a save it reported.
"""

from __future__ import annotations

import os
import signal

import pytest

from launcher.outlets.rundir import load_run
from launcher.views.records import render_status
from tests.conftest import SCRIPTS, read_events, read_summary, wait_for
from tests.test_faults import Job, jobs, launch  # noqa: F401 - `jobs` is a fixture

pytestmark = pytest.mark.e2e

FIT = str(SCRIPTS / "tutorial_backup.py")
LOOP = str(SCRIPTS / "tutorial_ctl_checkpoint.py")


def kill_worker1_after_a_save(job: Job, generation: int) -> None:
    """kill -9 worker 1 of `generation` once it reported a completed save."""
    wait_for(lambda: [e for e in job.events("progress", generation=generation, task="worker1")
                      if "saved" in e], timeout=150, what=f"a save in generation {generation}")
    os.kill(job.pids()[(generation, "worker1")], signal.SIGKILL)


def assert_free_restarts_with_resumes(job: Job, kills: int) -> list[dict]:
    assert job.finish(timeout=240) == 0, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == kills, summary
    restarts = job.events("restart")
    assert [r["counted"] for r in restarts] == [False] * kills, restarts  # a save: progress
    resumed = summary["resumed"]
    assert [r["generation"] for r in resumed] == list(range(1, kills + 1)), resumed
    assert all(r["step"] > 0 for r in resumed), resumed
    steps = [r["step"] for r in resumed]
    assert steps == sorted(steps), resumed
    assert [e["step"] for e in job.events("resumed")] == steps
    return resumed


def test_three_kills_of_a_tutorial_fit_with_its_own_backup_are_free_restarts(
        workdir, jobs):  # noqa: F811
    job = launch(jobs, ["--local", "2", "--max-restarts", "1", "--no-live", FIT,
                        str(workdir / "backup")], workdir)
    for generation in range(3):
        kill_worker1_after_a_save(job, generation)
    resumed = assert_free_restarts_with_resumes(job, 3)
    assert all(r["step"] % 40 == 0 and r["epoch"] == r["step"] // 40 for r in resumed), resumed
    assert all(r["saved_step"] == r["step"] for r in resumed), resumed  # a shared backup
    assert "generation 1 resumed at epoch" in job.output
    assert not job.events("resume_behind")


def test_a_custom_loop_with_its_own_checkpoint_manager_resumes_and_restarts_free(
        workdir, jobs):  # noqa: F811
    job = launch(jobs, ["--local", "2", "--max-restarts", "1", "--no-live", LOOP,
                        str(workdir / "ckpt")], workdir)
    for generation in range(2):
        kill_worker1_after_a_save(job, generation)
    resumed = assert_free_restarts_with_resumes(job, 2)
    assert all(r["step"] % 20 == 0 for r in resumed), resumed
    saves = [e for e in read_events(job.run_dir) if e["event"] == "progress" and "saved" in e
             and e["task"] == "worker0"]
    assert saves and all(e["saved_dir"] == str(workdir / "ckpt") for e in saves), saves[:2]


def test_a_backup_directory_local_to_each_host_is_called_out_on_the_first_restart(
        workdir, jobs):  # noqa: F811
    job = launch(jobs, ["--local", "2", "--max-restarts", "1", "--no-live", FIT,
                        str(workdir / "backup"), "per-host"], workdir)
    kill_worker1_after_a_save(job, 0)
    behind = job.wait_event("resume_behind", timeout=150)
    # Worker 1 restores from its own empty folder; worker 0 saved into host0's.
    assert behind["task"] == "worker1" and behind["step"] == 0, behind
    assert behind["saved_step"] >= 40 and behind["directory"] == str(workdir / "backup" / "host0")
    status = render_status(load_run(job.run_dir))
    assert "worker1 resumed at step 0, behind the last save" in status, status
    [entry] = wait_for(lambda: job.events("resumed"), timeout=30, what="resumed")
    assert entry["saved_step"] == behind["saved_step"], entry
    job.proc.send_signal(signal.SIGINT)
    job.finish(timeout=60)
    said = [line for line in job.output.splitlines() if "behind the last save" in line]
    assert len(said) == 1 and str(workdir / "backup" / "host0") in said[0], job.output[-3000:]
