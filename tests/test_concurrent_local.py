"""Two simulated-host jobs at once on one machine: no shared ports, no shared checkpoints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_summary, run_cli, start_cli, wait_for

pytestmark = pytest.mark.e2e

STEPS = str(SCRIPTS / "fault_steps.py")


def test_two_local_jobs_started_together_both_succeed(workdir: Path):
    first = start_cli(["--local", "2", "--run-dir", str(workdir / "a"), STEPS, "--steps", "30"],
                      cwd=workdir)
    second = start_cli(["--local", "2", "--run-dir", str(workdir / "b"), STEPS, "--steps", "30"],
                       cwd=workdir)
    outputs = []
    for proc in (first, second):
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        outputs.append(out)
        assert proc.returncode == 0, out[-3000:]
    for run in ("a", "b"):
        assert read_summary(workdir / run)["status"] == "succeeded"
    # One of them got the default checkpoint directory, the other the next free one:
    # neither resumed from the other's steps.
    both = "\n".join(outputs)
    assert "checkpoints/local is in use by another run: this run uses" in both, both[-3000:]
    assert "checkpoints/local-2" in both
    assert both.count("RESUME gen=0 step=0") == 4  # every worker of both jobs from scratch
    assert (workdir / "checkpoints" / "local" / "step").read_text() == "30"
    assert (workdir / "checkpoints" / "local-2" / "step").read_text() == "30"


def test_a_checkpoint_dir_named_by_two_running_jobs_is_refused(workdir: Path):
    config = workdir / "c.yaml"
    config.write_text("name: shared\ntransport: local\ncheckpoint: {dir: ckpt}\nhosts:\n"
                      "  - {address: 127.0.0.1}\n")
    first = start_cli(["--run-dir", str(workdir / "a"), str(config), STEPS, "--steps", "400"],
                      cwd=workdir)
    try:
        wait_for(lambda: (workdir / "a" / "events.jsonl").exists(), timeout=60,
                 what="the first job's launch")
        second = run_cli(["--run-dir", str(workdir / "b"), str(config), STEPS], cwd=workdir,
                         timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "ckpt is in use by the run in" in second.stderr and str(workdir / "a") in \
            second.stderr
        assert not (workdir / "b").exists() or not any((workdir / "b").iterdir())
    finally:
        first.kill()
        first.communicate()
