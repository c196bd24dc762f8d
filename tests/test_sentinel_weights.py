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
NAN_FIT = str(SCRIPTS / "tutorial_nan.py")


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
    monkeypatch.setattr(sentinel, "_spoiled", False)  # a loss that stayed finite:
    monkeypatch.setattr(sentinel, "_weights_bad", True)  # its save of step 80 refused
    monkeypatch.setattr(sentinel, "_weights_bad_at", 80)
    with pytest.raises(RuntimeError, match=r"its weights went non-finite \(its save of step 80 "
                                           r"refused\) and the launcher did not stop"):
        sentinel.hold_spoiled_weights(hold_s=0.05)


def test_a_refused_save_reads_the_loss_of_its_step_first(monkeypatch):
    """A save's weights checked at a batch's end, before the loss callback has
    read that batch's loss (tf_keras logs tensors, read a step late): the
    refused save reads it first. A bad one is reported before the save (it
    names the step for the replay and the skip); a finite one makes the save's
    own report the cause, and `fit` keeps the backup and holds its weights."""
    import math

    import tf_keras

    from launcher import runtime

    said: list[dict] = []
    monkeypatch.setattr(runtime, "write_progress", said.append)
    for name, value in (("_spoiled", False), ("_told", False), ("_weights_bad", False),
                        ("_weights_bad_at", None)):
        monkeypatch.setattr(sentinel, name, value)
    monkeypatch.delenv("TF_CONFIG", raising=False)  # alone: the chief
    assert sentinel.loss_at_save(8, rolled_back=False) == ""  # no fit watched: its own words
    watch = sentinel._loss_callback(tf_keras.callbacks)()
    monkeypatch.setattr(sentinel, "_active", [watch])
    monkeypatch.setattr(sentinel, "_fits", 1)  # in its `fit`
    watch.on_epoch_begin(0)
    watch.on_train_batch_begin(0)
    watch.on_train_batch_end(0, {"loss": 0.5})
    assert sentinel.loss_at_save(1, rolled_back=False) == "finite" and not said
    assert not sentinel._weights_bad  # a save the launcher does not roll back
    watch.on_train_batch_end(1, {"loss": 0.4})
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert sentinel.loss_at_save(2, rolled_back=True) == "finite"
    assert not sentinel._weights_bad  # a worker's own NaN: the chief's saves are good
    monkeypatch.delenv("TF_CONFIG")
    assert sentinel.loss_at_save(2, rolled_back=True) == "finite"
    assert sentinel._weights_bad_at == 2  # held back from the script, the backup kept
    watch.on_train_batch_end(2, {"loss": math.nan})
    assert sentinel.loss_at_save(3, rolled_back=True) == "bad"
    assert [record["nonfinite"] for record in said] == [[3, 0, 2]]


def test_a_refused_save_in_a_fit_whose_loss_is_not_read_holds_on_the_chief_only(monkeypatch):
    """A `fit` the sentinel cannot watch (its callbacks given by position): as
    the launcher judges it, a worker's refused save is a warning (nothing held,
    its backup deleted as usual), the chief's rolls back (held, kept)."""
    for name, value in (("_spoiled", False), ("_weights_bad", False), ("_active", []),
                        ("_fits", 1)):
        monkeypatch.setattr(sentinel, name, value)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert sentinel.loss_at_save(40, rolled_back=True) == "unwatched"
    assert not sentinel._weights_bad
    monkeypatch.delenv("TF_CONFIG")
    assert sentinel.loss_at_save(40, rolled_back=True) == "unwatched"
    assert sentinel._weights_bad
    monkeypatch.setattr(sentinel, "_fits", 0)  # a custom loop: any worker's rolls back
    monkeypatch.setattr(sentinel, "_weights_bad", False)
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:1"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    assert sentinel.loss_at_save(40, rolled_back=True) == "" and sentinel._weights_bad


def test_the_launcher_rolls_back_a_finite_losss_refused_save_on_the_chief_at_any_report():
    """In a `fit` whose loss stayed finite or is not read, a refused save rolls
    back when it is the chief's (its saves are the job's; a worker's own NaN, a
    fused ReLU's, leaves them good: a warning), whether or not a report of the
    generation came before it; a custom loop's, any worker's; a bad loss's save
    is the loss's to judge."""
    from types import SimpleNamespace

    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.failkinds import Kind
    from launcher.job.record.reports import ProgressReport

    gen = SimpleNamespace(plan=SimpleNamespace(generation=0), failure=None,
                          phase=SimpleNamespace(running=True))

    def hear(sentinel: Sentinel, task: str, report: dict):
        record = SimpleNamespace(task=SimpleNamespace(name=task, host="host" + task[-1]))
        return sentinel.hear(gen, record, ProgressReport.read(report))

    refused = {"saved_nonfinite": 80, "saved_dir": "/ckpt", "save_skipped": 1,
               "saved_loss": "finite"}
    sentinel = Sentinel(lambda event: None)
    assert hear(sentinel, "worker1", refused) is None
    found = hear(sentinel, "worker0", {**refused, "chief": 1})  # the generation's second
    assert found is not None and (found.kind, found.how) == (Kind.NONFINITE, "weights")
    assert hear(Sentinel(lambda event: None), "worker0",
                {**refused, "chief": 1, "saved_loss": "bad"}) is None
    custom = hear(Sentinel(lambda event: None), "worker1",
                  {key: v for key, v in refused.items() if key != "saved_loss"})
    assert custom is not None and custom.how == "save"  # a custom loop's: any worker's
    unwatched = {**refused, "saved_loss": "unwatched"}  # a fit whose loss is not read
    assert hear(Sentinel(lambda event: None), "worker1", unwatched) is None
    found = hear(Sentinel(lambda event: None), "worker0", {**unwatched, "chief": 1})
    assert found is not None and found.how == "save"


def test_weights_refused_at_the_same_save_twice_in_a_row_stop_the_job_and_at_another_do_not():
    """Sentinel.judged after two generations' weights were refused: at the
    same save, no loss gone bad first, the job stops naming the save and why no
    batch is skipped (a custom loop: its loss is not read); at another save, or
    after a loss that went bad (its own rule), restarted as before."""
    from types import SimpleNamespace

    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.reports import ProgressReport
    from launcher.job.record.states import Failure

    def judged(saves: list[int], report: dict, loss_step: int | None = None) -> dict:
        sentinel = Sentinel(lambda event: None)
        for generation, step in enumerate(saves):
            gen = SimpleNamespace(plan=SimpleNamespace(generation=generation), failure=None,
                                  phase=SimpleNamespace(running=True))
            record = SimpleNamespace(task=SimpleNamespace(name="worker0", host="host0"))
            said = [{"nonfinite": [loss_step, 1, 9], "nonfinite_loss": "nan"}] \
                if loss_step is not None else []
            found = [sentinel.hear(gen, record, ProgressReport.read(report)) for report in
                     [*said, {**report, "saved_nonfinite": step}]]
            assert found[0] is not None  # the generation's failure
        return sentinel.judged([Failure(task="host0/worker0", host="host0", generation=g, t=0.0,
                                        kind="nonfinite", reason="x") for g in range(len(saves))])

    refused = {"saved_dir": "/ckpt", "save_skipped": 1, "chief": 1}
    custom = judged([80, 80], refused)["again"]
    assert custom.startswith("the weights were not finite at the save of step 80 again") \
        and "the loss of a custom loop is its own, not read" in custom, custom
    assert "its loss stayed finite" in judged([80, 80], {**refused, "saved_loss": "finite"})[
        "again"]
    assert judged([80, 120], refused) == {"free": False}  # another save: counted, restarted
    assert judged([80], refused) == {"free": True}
    after_loss = judged([80, 80], {**refused, "saved_loss": "bad"}, loss_step=70)["again"]
    assert after_loss.startswith("the loss went non-finite at step 70 again"), after_loss


def test_a_refused_save_in_a_workers_scratch_folder_names_the_directory_it_stands_for(
        monkeypatch, tmp_path):
    """TF's custom-loop tutorial saves a non-chief worker's copy into
    `DIR/workertemp_<n>` and removes it: a refused save there names DIR, the
    directory the user knows and the restart reads, whichever worker told first."""
    from launcher import runtime
    from launcher.runtime import saves

    said: list[dict] = []
    monkeypatch.setattr(runtime, "write_progress", said.append)
    scratch = tmp_path / "ckpt" / "workertemp_1"
    saves._nonfinite(object(), lambda saver, args, kwargs: str(scratch), (), {}, skipped=True)
    assert said[0]["saved_dir"] == str(tmp_path / "ckpt") and said[0]["save_skipped"] == 1


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


@pytest.mark.e2e
def test_a_fit_whose_weights_go_nan_while_its_loss_stays_finite_is_rolled_back(
        workdir, jobs):  # noqa: F811
    """A tutorial-shaped tf_keras `fit` (its own BackupAndRestore, a save
    each epoch of 40 steps) with a BatchNormalization whose moving variance
    goes NaN at step 50 of generation 0: training reads the batch's own
    statistics, so the loss stays finite and the sentinel's loss watch sees
    nothing. The save of step 80 is refused, the generation stops there, the
    restart resumes from step 40 and the job ends with finite weights (before:
    "succeeded", every later save refused, the backup deleted, NaN weights)."""
    config = cluster(workdir, "tf_keras",
                     "env: {POISON_AT_STEP: 50, POISON_BY: stats, POISON_ONCE: 1}\n")
    job = launch(jobs, [str(config), "--no-live", NAN_FIT, str(workdir / "backup")], workdir)
    assert job.finish(timeout=300) == 0, job.output[-3000:]
    [failure] = job.events("failure_detected")
    assert failure["kind"] == "nonfinite" and failure["generation"] == 0, failure
    assert not job.events("nonfinite"), job.events("nonfinite")  # no loss went bad
    assert [e["step"] for e in job.events("nonfinite_save")] == [80], \
        job.events("nonfinite_save")
    assert [r["step"] for r in job.events("resumed")] == [40], job.events("resumed")
    assert "its weights were not finite at its save of step 80" in job.output and \
        "though its loss was" in job.output, job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    logs = "".join(log.read_text() for log in (job.run_dir / "logs").glob("*.log"))
    assert logs.count("WEIGHTS_FINITE True") == 2 and "WEIGHTS_FINITE False" not in logs, logs


@pytest.mark.e2e
def test_weights_that_go_nan_again_before_the_same_save_stop_the_job_saying_so(
        workdir, jobs):  # noqa: F811
    """The same fit with its moving variance going NaN at step 50 in every
    generation (bad state that comes back, not a one-off): the replay from
    step 40 refuses the save of step 80 again. No step can be skipped (the
    loss stayed finite: which step spoiled the weights is not known), so the
    job stops after that one replay, saying why and keeping the good backup;
    before: a restart counted each time until `max_restarts`, in a crash
    loop's words."""
    config = cluster(workdir, "tf_keras", "env: {POISON_AT_STEP: 50, POISON_BY: stats}\n")
    job = launch(jobs, [str(config), "--no-live", "--max-restarts", "3", NAN_FIT,
                        str(workdir / "backup")], workdir)
    assert job.finish(timeout=300) != 0, job.output[-3000:]
    assert [e["step"] for e in job.events("nonfinite_save")] == [80, 80], \
        job.events("nonfinite_save")
    assert [r["step"] for r in job.events("resumed")] == [40], job.events("resumed")
    summary = read_summary(job.run_dir)
    assert summary["status"] == "failed" and summary["stopped_by"] == "nonfinite", summary
    assert summary["restarts"] == 1, summary
    assert "the weights were not finite at the save of step 80 again" in summary["message"] \
        and "its loss stayed finite" in summary["message"], summary["message"]
    assert "job succeeded" not in job.output and "crash loop" not in job.output
    assert any((workdir / "backup").rglob("*.index")), "the good backup is kept"


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
