"""Weights spoiled by a NaN, as users meet it beyond the loss the sentinel reads
(launcher/runtime/sentinel.py, launcher/job/detect/sentinel.py): `fit` holds
such weights back from the script's code after it (`hold_spoiled_weights`);
a custom loop, whose loss nobody reads, is rolled back at its first save of
non-finite weights instead of training on to "succeeded" with every save
refused. The loss's own path is tests/test_sentinel.py."""

from __future__ import annotations

import pytest

from launcher.runtime import sentinel
from tests.conftest import SCRIPTS, read_summary
from tests.test_faults import jobs, launch  # noqa: F401 - `jobs` is a fixture
from tests.test_sentinel import cluster

CTL = str(SCRIPTS / "tutorial_ctl_checkpoint.py")


def test_healthy_weights_return_at_once_and_spoiled_ones_never_past_the_bound(
        monkeypatch, capsys):
    monkeypatch.setattr(sentinel, "_spoiled", False)
    assert sentinel.hold_spoiled_weights(hold_s=30) is None  # no wait: it returns
    monkeypatch.setattr(sentinel, "_spoiled", True)
    monkeypatch.setattr(sentinel, "_spoiled_at", 239)
    with pytest.raises(RuntimeError, match="went bad at step 239 and the launcher did not "
                                           "stop this task within 0 s"):
        sentinel.hold_spoiled_weights(hold_s=0.05)
    assert "fit() ended after the loss went bad at step 239: its weights are not handed " \
        "back to the script" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_custom_loop_whose_weights_go_nan_is_rolled_back_at_its_first_refused_save(
        workdir, jobs):  # noqa: F811
    """TF's custom-loop tutorial shape (its own CheckpointManager, 20 steps an
    epoch, a save at each epoch's end, no runtime calls): worker 1's output
    bias goes NaN before step 30 in generation 0, the all-reduce spreads it.
    The save of step 40 is refused, the generation stops there, and the
    restart resumes from step 20, the last good save, and trains clean."""
    config = cluster(workdir, "tf_keras", "env: {POISON_AT_STEP: 30}\n")
    job = launch(jobs, [str(config), "--no-live", CTL, str(workdir / "ckpt")], workdir)
    assert job.finish(timeout=300) == 0, job.output[-3000:]
    [failure] = job.events("failure_detected")
    assert failure["kind"] == "nonfinite" and failure["generation"] == 0, failure
    assert [e["step"] for e in job.events("nonfinite_save")] == [40], \
        job.events("nonfinite_save")
    assert [r["step"] for r in job.events("resumed")] == [20], job.events("resumed")
    assert "its weights were not finite at its save of step 40" in job.output, \
        job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    logs = "".join(log.read_text() for log in (job.run_dir / "logs").glob("*.log"))
    assert logs.count("WEIGHTS_FINITE True") == 2 and "WEIGHTS_FINITE False" not in logs, logs
