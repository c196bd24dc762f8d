"""After a restart the launcher says where the new generation resumed
(launcher/job/detect/resumes.py): a real fit that crashes once, and the bookkeeping."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.job.detect.resumes import Resumes
from launcher.job.record.events import Resumed
from launcher.views.narrate import line
from tests.conftest import SCRIPTS, read_events, read_summary, run_cli
from tests.test_strategies import explain


@pytest.mark.e2e
def test_a_restarted_fit_says_the_epoch_it_resumed_at(workdir: Path):
    run_dir = workdir / "run"
    result = run_cli(["--local", "1", "--max-restarts", "2", "--run-dir", str(run_dir),
                      str(SCRIPTS / "crash_after_epoch.py")], cwd=workdir, timeout=240)
    assert result.returncode == 0, explain(result)
    assert "BEGIN gen=1 epoch=2" in result.stdout, explain(result)  # what the script saw
    assert "generation 1 resumed at epoch 2 (step 10)" in result.stdout, explain(result)
    summary = read_summary(run_dir)
    assert summary["restarts"] == 1, summary
    [entry] = summary["resumed"]
    assert entry["generation"] == 1 and entry["epoch"] == 2 and entry["step"] == 10, entry
    assert entry["checkpoint"], entry  # the backup's series, seen on disk at the restart
    events = [e for e in read_events(run_dir) if e["event"] == "resumed"]
    assert [e["epoch"] for e in events] == [2], events


def notice(entry: dict) -> str:
    """The line the terminal shows for the `resumed` event of `entry`."""
    said = line(Resumed(**entry))
    assert said is not None and said[0] == "notice"
    return said[1]


def test_a_custom_loop_resumes_at_its_reported_step_and_a_first_start_says_nothing():
    resumes = Resumes()
    resumes.starting(0, None)
    assert resumes.on_progress(0, {"step": 5}) is None  # not a restart
    resumes.starting(1, {"ckpt/checkpoint": (3,)})
    entry = resumes.on_progress(1, {"step": 300, "loss": 0.1})
    assert entry == {"generation": 1, "step": 300, "checkpoint": {"ckpt/checkpoint": [3]},
                     "past": 0}
    assert notice(entry) == ("generation 1 resumed at step 300, past where generation 0 began "
                             "(step 0): that restart is progress")
    assert resumes.on_progress(1, {"step": 301}) is None  # once per generation
    resumes.starting(2, None)
    fresh = resumes.on_progress(2, {"step": 0, "epoch": 0.0, "start_epoch": 1.0,
                                    "start_step": 0.0})
    assert notice(fresh) == "generation 2 started from the beginning (no checkpoint restored)"
    assert [e["generation"] for e in resumes.entries] == [1, 2]


def test_saves_resumes_past_the_previous_one_and_a_resume_behind_the_last_save():
    from launcher.job.policy.recovery import Budget
    from launcher.job.record.events import ResumeBehind

    resumes = Resumes()
    resumes.starting(0, None)
    resumes.on_save("worker1", {"saved": 40, "saved_dir": "/h1/backup"})
    resumes.on_save("worker0", {"saved": 40, "saved_dir": "/h0/backup", "chief": 1})
    resumes.on_save("worker0", {"step": 41, "counted": 1})  # no save: nothing
    assert resumes.last_save == {"step": 40, "dir": "/h0/backup", "task": "worker0",
                                 "chief": True}
    resumes.starting(1, None)
    # The chief restored the shared backup; worker 1 its own empty folder.
    [first] = resumes.told(1, "worker0", {"resumed": 40, "resumed_epoch": 1})
    assert first == Resumed(generation=1, epoch=1, step=40, saved_step=40, past=0)
    [behind] = resumes.told(1, "worker1", {"resumed": 0, "resumed_epoch": 0})
    assert behind == ResumeBehind(generation=1, task="worker1", step=0, saved_step=40,
                                  directory="/h0/backup", by="worker0")
    assert resumes.told(1, "worker1", {"resumed": 0}) == []  # said once per job
    resumes.starting(2, None)
    [same] = resumes.told(2, "worker0", {"resumed": 40})
    assert same.past is None  # no further than generation 1: no progress shown
    # A counted restart given back: the budget as if it had been free.
    spent = Budget(max_restarts=1).after(counts=True)
    assert spent.exhausted and not spent.refund().exhausted


def test_a_tasks_later_steps_are_no_resume_points_and_steps_are_the_jobs():
    """The drill's kill of the bundled example (issue 53): runtime.callbacks()
    says it started at 22, then counts this generation's steps from 1. Step 1
    is no resume "behind the last save (22)"; every view reads 22, 23, ..."""
    resumes = Resumes()
    resumes.starting(0, None)
    resumes.told(0, "worker0", {"saved": 22, "saved_dir": "/ckpt", "chief": 1,
                                "checkpoint": 1})
    resumes.starting(1, None)
    start = {"step": 0, "epoch": 1.0, "start_epoch": 1.0, "start_step": 22.0}
    for task in ("worker1", "worker0"):
        assert resumes.job_step(1, task, start) == 22
        told = resumes.told(1, task, start)
        assert not [e for e in told if e.kind == "resume_behind"], told
    for step in (1, 5, 22):
        for task in ("worker1", "worker0"):
            assert resumes.job_step(1, task, {"step": step, "epoch": 1.0}) == 22 + step
            told = resumes.told(1, task, {"step": step, "epoch": 1.0})
            assert not [e for e in told if e.kind == "resume_behind"], (step, told)
    # the optimizer's count is the job's already
    assert resumes.job_step(1, "worker0", {"step": 30, "counted": 1}) == 30


def test_progress_is_a_save_past_the_best_before_and_unknown_is_said():
    """A save after a restart from step 0 that does not pass the best save
    before it is no progress (chief-only evaluate, its backup deleted by fit);
    a save past it is; where steps cannot be compared, None (issue 53 item 2)."""
    resumes = Resumes()
    resumes.starting(0, None)
    assert resumes.moved_past() is None  # nothing saved yet: cannot be told
    resumes.told(0, "worker0", {"saved": 40, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is True  # the first save of the job
    resumes.told(0, "worker0", {"deleted": "/b"})  # fit ended: its backup deleted
    resumes.starting(1, None)
    told = resumes.told(1, "worker1", {"step": 0, "start_epoch": 1.0, "start_step": 0.0})
    assert not [e for e in told if e.kind == "resume_behind"], "the save was deleted"
    for step in (20, 40):
        resumes.told(1, "worker0", {"saved": step, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is False  # trained again up to 40: no progress
    resumes.starting(2, None)
    resumes.told(2, "worker0", {"resumed": 40, "resumed_epoch": 1})
    resumes.told(2, "worker0", {"saved": 60, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is True
    # Weights restored without their optimizer (an .h5 and initial_epoch): a later
    # epoch at optimizer step 0: the saves' steps are counted anew, not compared.
    resumes.starting(3, None)
    resumes.told(3, "worker0", {"resumed": 0, "resumed_epoch": 2})
    resumes.told(3, "worker0", {"saved": 20, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is None
    resumes.starting(4, None)  # no resume point heard: cannot be told either
    resumes.told(4, "worker0", {"saved": 80, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is None
    resumes.starting(5, None)
    resumes.told(5, "worker0", {"resumed_unknown": "the checkpoint holds no optimizer"})
    resumes.told(5, "worker0", {"saved": 2, "saved_dir": "/b", "chief": 1})
    assert resumes.moved_past() is None  # steps counted anew: cannot be compared


def test_a_checkpoint_passed_over_is_said_once_and_its_resume_is_not_behind():
    from launcher.job.record.events import CheckpointPassedOver

    resumes = Resumes()
    resumes.starting(0, None)
    for step in (20, 40, 60):
        resumes.on_save("worker0", {"saved": step, "saved_dir": "/c", "chief": 1})
    resumes.starting(1, None)
    over = {"passed_over": "/c/ckpt-3", "passed_over_why": "its data file is shorter",
            "passed_over_to": "/c/damaged/ckpt-3-x", "passed_over_for": "/c/ckpt-2"}
    [said] = resumes.told(1, "worker0", over)
    assert said == CheckpointPassedOver(generation=1, task="worker0", checkpoint="/c/ckpt-3",
                                        why="its data file is shorter",
                                        kept_in="/c/damaged/ckpt-3-x", restored="/c/ckpt-2")
    assert "passed over checkpoint /c/ckpt-3" in line(said)[1]
    assert resumes.told(1, "worker1", over) == []  # the same checkpoint, by a peer: said once
    [resumed] = resumes.told(1, "worker0", {"resumed": 40})
    assert isinstance(resumed, Resumed)
    assert resumes.told(1, "worker1", {"resumed": 40}) == []  # behind step 60 by design
    # Progress: a save past where it resumed (60, the unreadable save, is gone).
    assert resumes.moved_past() is None
    resumes.on_save("worker0", {"saved": 60, "saved_dir": "/c", "chief": 1})
    assert resumes.moved_past() is True


def test_a_save_passed_over_as_unreadable_is_no_longer_the_best():
    """Generation 0 saves 400 and 500; 500 is torn and passed over, generation 1
    resumes at 400 and saves 450; generation 2 resumes at 450: not "behind the
    last save (500)", and its save at 480 is progress (the review of issue 51)."""
    resumes = Resumes()
    resumes.starting(0, None)
    for step in (400, 500):
        resumes.told(0, "worker0", {"saved": step, "saved_dir": "/c", "chief": 1})
    resumes.starting(1, None)
    resumes.told(1, "worker0", {"passed_over": "/c/ckpt-5", "passed_over_why": "torn",
                                "passed_over_for": "/c/ckpt-4"})
    resumes.told(1, "worker0", {"resumed": 400})
    resumes.told(1, "worker0", {"saved": 450, "saved_dir": "/c", "chief": 1})
    assert resumes.moved_past() is True
    resumes.starting(2, None)
    told = resumes.told(2, "worker0", {"resumed": 450})
    assert not [e for e in told if e.kind == "resume_behind"], told
    resumes.told(2, "worker0", {"saved": 480, "saved_dir": "/c", "chief": 1})
    assert resumes.moved_past() is True
