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
@pytest.mark.parametrize("save_with", ["manager", "checkpoint"])
def test_a_custom_loop_whose_weights_go_nan_is_rolled_back_at_its_first_refused_save(
        workdir, jobs, save_with):  # noqa: F811
    """TF's custom-loop tutorial shape (20 steps an epoch, a save at each
    epoch's end, no runtime calls), saving with its own CheckpointManager or
    with `checkpoint.save(prefix)` and restoring `tf.train.latest_checkpoint`:
    worker 1's output bias goes NaN before step 30 in generation 0, the
    all-reduce spreads it. The save of step 40 is refused (the manager's) or
    made and taken off the directory's newest (Checkpoint.save's: the script
    holds its path), the generation stops there, and the restart resumes
    from step 20, the last good save, and trains clean."""
    config = cluster(workdir, "tf_keras", f"env: {{POISON_AT_STEP: 30, SAVE_WITH: {save_with}}}\n")
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


def test_a_save_taken_off_the_newest_leaves_the_one_before_or_none_and_keeps_its_files(
        tmp_path):
    """readable.name_newest, as Checkpoint.save of NaN weights uses it: the
    state names the save before again (latest_checkpoint, a restart's
    restore), or is removed when there was none; the bad save's files stay."""
    import tensorflow as tf

    from launcher.runtime import readable

    checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0]))
    first, bad = (checkpoint.save(str(tmp_path / "ckpt")) for _ in range(2))
    assert readable.newest(str(tmp_path)) == bad
    assert readable.name_newest(str(tmp_path), bad, first)
    assert tf.train.latest_checkpoint(str(tmp_path)) == first
    assert not readable.name_newest(str(tmp_path), bad, first)  # not the newest: untouched
    assert tf.train.latest_checkpoint(str(tmp_path)) == first
    assert readable.name_newest(str(tmp_path), first, None)  # nothing good before it
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    assert all((tmp_path / f"{name}.index").exists() for name in ("ckpt-1", "ckpt-2"))


def test_a_save_check_reads_moving_statistics_and_forgives_an_infinity_that_may_be_a_start():
    """A BatchNormalization's moving variance gone NaN (trained on a bad batch,
    not a trainable weight) makes a save of the model refused, through a Keras
    saver's model and a tf.train.Checkpoint alike; a `best = tf.Variable(inf)`
    and a running minimum's buffer of infinities do not. The restore's rule
    (runtime/readable.py) judges only matrices and beyond, where a NaN-trained
    model's kernels are."""
    import numpy as np
    import tensorflow as tf

    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(3),
                                 tf.keras.layers.BatchNormalization()])
    best = tf.Variable(np.inf)
    low = tf.Variable([np.inf] * 4, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, best=best, low=low)

    class Saver:  # what a Keras callback is to the check: its `model`
        pass

    saver = Saver()
    saver.model = model
    assert sentinel.all_finite(sentinel.saved_variables(checkpoint))
    assert sentinel.all_finite(sentinel.saved_variables(saver))
    variance = model.layers[-1].moving_variance
    variance.assign(tf.constant([1.0, float("nan"), 1.0]))
    assert any(v is variance for v in sentinel.saved_variables(checkpoint))
    assert not sentinel.all_finite(sentinel.saved_variables(checkpoint))
    assert not sentinel.all_finite(sentinel.saved_variables(saver))
    kernel = model.layers[0].kernel
    assert not sentinel.all_finite([tf.Variable([1.0, np.inf])])  # trainable: never right
    from launcher.runtime import readable

    assert readable._not_finite("low", low.numpy()) == ""  # a vector: not judged on restore
    assert "holds NaN" in readable._not_finite("kernel", np.full(kernel.shape, np.nan))
    assert "`sentinel: off`" in readable._not_finite("kernel", np.full((2, 2), np.inf))
