"""A stop says whether the tasks could save, and how to make them
(launcher/job/policy/stops.py): a real detached tf_keras fit stopped with
`mgpu-launch stop`, and the summary's `stop` entry of each outcome."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.job.policy.stops import entry
from launcher.job.record.states import RunResult
from tests.conftest import SCRIPTS, read_events, read_summary, run_cli, wait_for

TRAIN = str(SCRIPTS / "fault_train.py")


@pytest.mark.e2e
def test_stop_of_a_fit_that_cannot_save_says_so_and_how(workdir: Path):
    run_dir = workdir / "run"
    started = run_cli(["--detach", "--local", "1", "--run-dir", str(run_dir), TRAIN,
                       "--epochs", "1000"], cwd=workdir, timeout=60)
    try:
        assert started.returncode == 0, started.stderr
        wait_for(lambda: any(e["event"] == "progress" for e in read_events(run_dir)), 120,
                 "the fit's first progress report")
        stopped = run_cli(["stop", str(run_dir)], cwd=workdir, timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        first, *rest = stopped.stdout.splitlines()
        assert "runtime.callbacks(save_on_sigterm=True)" in first, first
        assert "task(s) did not save" in "\n".join(rest), stopped.stdout
        stop = read_summary(run_dir)["stop"]
        assert stop["signal"] == "SIGTERM" and stop["saved"] == [], stop
        assert [u["task"] for u in stop["did_not_save"]] == ["host0/worker0"], stop
        assert "save_on_sigterm=True" in stop["said"], stop
    finally:
        if not (run_dir / "summary.json").exists() and (run_dir / "launcher.pid").exists():
            run_cli(["stop", str(run_dir), "--timeout", "30"], cwd=workdir, timeout=60)


def _result(**tasks: dict) -> RunResult:
    return RunResult(status="interrupted", restarts=0, wall_s=1.0, root_cause=None,
                     tasks=tasks, interrupted_by=signal.SIGINT)


def test_the_stop_entry_of_each_outcome():
    saved = entry(_result(**{"h0/worker0": {"exit_code": 42, "signal": None},
                             "h1/worker1": {"exit_code": 42, "signal": None}}), 3.0)
    assert saved["saved"] == ["h0/worker0", "h1/worker1"] and "every task saved" in saved["said"]
    killed = entry(_result(**{"h0/worker0": {"exit_code": None, "signal": 9}}), 3.0)
    assert killed["did_not_save"] == [{"task": "h0/worker0", "signal": "SIGKILL"}]
    assert "after the 3 s grace" in killed["said"] and "save_on_sigterm" in killed["said"]
    exited = entry(_result(**{"h0/worker0": {"exit_code": 0, "signal": None}}), 3.0)
    assert exited["exited"] == ["h0/worker0"] and "by themselves" in exited["said"]
    done = RunResult(status="succeeded", restarts=0, wall_s=1.0, root_cause=None, tasks={})
    assert entry(done, 3.0) is None
