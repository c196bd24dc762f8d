"""The NaN sentinel (issue 52) as users meet it: a tutorial-shaped Keras `fit`
(its own BackupAndRestore, a save each epoch, no runtime calls) whose input
holds one batch of 1e30 at step 100 on worker 1, under two simulated hosts.

The loss is named at its step, epoch, batch and task (events.jsonl, the
terminal, `status`, summary.json); no save after it is made or reported as a
save; the generation is stopped and the restart resumes from the save before
the bad step; the same step going bad again is the batch's doing: under
tf_keras, where the input's position is carried, that batch is skipped (at
most `sentinel.max_skips`), else the job stops naming the step
(launcher/runtime/sentinel.py, launcher/job/detect/sentinel.py,
launcher/runtime/epochinput.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.job.policy.recovery import Budget, decide_restart
from launcher.job.record import events as ev
from launcher.job.record.states import Failure
from launcher.job.record.story import Story
from launcher.outlets.rundir import load_run
from launcher.spec.config import parse_config
from launcher.spec.outlets import NotifySettings
from launcher.spec.taskenv import shared_env
from launcher.views import narrate, notify
from launcher.views.metrics import JobMetrics
from launcher.views.records import render_status
from tests.conftest import SCRIPTS, read_summary
from tests.test_faults import Job, jobs, launch, write_yaml  # noqa: F401 - `jobs` is a fixture

NAN = str(SCRIPTS / "tutorial_nan.py")
BAD_STEP, STEPS_PER_EPOCH = 100, 40


def cluster(workdir: Path, keras: str, extra: str = "") -> Path:
    """Two simulated hosts; `extra`: more of the cluster file."""
    return write_yaml(workdir / "cluster.yaml", f"""\
name: nan
transport: local
keras: {keras}
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: host0}}
  - {{address: 127.0.0.1, name: host1}}
restart: {{backoff_s: 0}}
{extra}""")


def saves(job: Job, generation: int) -> list[int]:
    """The saves the chief reported in `generation` (their steps)."""
    return [e["saved"] for e in job.events("progress", generation=generation, task="worker0")
            if "saved" in e]


def nonfinite(job: Job) -> list[tuple[int, int | None, int, int]]:
    """(generation, step, epoch, batch) of each `nonfinite` event."""
    found = job.events("nonfinite")
    # Keras logs the loss already reduced across the workers (its metrics read
    # in cross-replica context): every worker sees the bad step at once.
    assert all(e["task"] in ("worker0", "worker1") and e["loss"] in ("inf", "nan")
               and e["host"] == e["task"].replace("worker", "host") for e in found), found
    return [(e["generation"], e.get("step"), e["epoch"], e["batch"]) for e in found]


@pytest.mark.e2e
def test_a_loss_gone_bad_is_named_at_its_step_and_rolled_back_to_the_save_before_it(
        workdir, jobs):  # noqa: F811
    job = launch(jobs, [str(cluster(workdir, "keras3")), "--no-live", NAN,
                        str(workdir / "backup")], workdir)
    assert job.finish(timeout=400) == 0, job.output[-3000:]
    # Generation 0 goes bad at step 100 (epoch 3, batch 20); the restart resumes
    # from step 80, the save before it; Keras 3's input starts again from its
    # first batch, so the bad one comes back at step 180; the restart from step
    # 160 trains the last 80 steps on good batches.
    assert nonfinite(job) == [(0, BAD_STEP, 2, 19), (1, 180, 4, 19)], job.events("nonfinite")
    assert [f["kind"] for f in job.events("failure_detected")] == ["nonfinite", "nonfinite"]
    assert [r["step"] for r in job.events("resumed")] == [80, 160], job.events("resumed")
    assert saves(job, 0) == [40, 80] and saves(job, 1) == [120, 160], job.events("progress")
    said = [line for line in job.output.splitlines() if f"loss went inf at step {BAD_STEP}"
            in line]
    assert any("(epoch 3, batch 20 of it; generation 0)" in line for line in said), said
    assert any("stopped before it saves NaN weights" in line for line in said), said
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 2, summary
    assert "WEIGHTS_FINITE True" in job.output and "WEIGHTS_FINITE False" not in job.output
    assert summary["nonfinite"][0]["event"] == "nonfinite", summary["nonfinite"]
    status = render_status(load_run(job.run_dir))
    assert f"loss went inf at step {BAD_STEP} (epoch 3, batch 20 of it" in status, status
    # Each replay passed its bad step; Keras 3 read other batches there: no verdict.
    assert [(e["generation"], e["step"], e["exact"]) for e in job.events("replay_passed")] \
        == [(1, BAD_STEP, False), (2, 180, False)], job.events("replay_passed")
    assert "whether it was one-off or its batch cannot be told" in status, status


def epoch_batches(job: Job, generation: int) -> dict[int, int]:
    """The batches worker 0 trained in each epoch of `generation`, as it printed them."""
    said = (line.split("EPOCH_BATCHES ", 1)[1].split() for line in job.output.splitlines()
            if "EPOCH_BATCHES " in line)
    return {int(epoch): int(n) for g, epoch, n in said if int(g) == generation}


@pytest.mark.e2e
@pytest.mark.parametrize("keras", ["tf_keras", "keras3"])
def test_a_bad_batch_that_comes_back_at_its_step_is_skipped_where_the_input_position_is_carried(
        workdir, jobs, keras):  # noqa: F811
    """The restart from step 80 continues the input where the save left it (runtime/
    epochinput.py; Keras 3's epochinput3.py: its input one stream over the epochs), so
    the bad batch is read at step 100 again: the batch, not a one-off fault.
    Generation 2 skips exactly it (read and dropped, not trained); the job succeeds."""
    extra = "env: {INPUT: repeat}\n" if keras == "keras3" else ""
    job = launch(jobs, [str(cluster(workdir, keras, extra)), "--no-live", NAN,
                        str(workdir / "backup")], workdir)
    assert job.finish(timeout=400) == 0, job.output[-3000:]
    assert nonfinite(job) == [(0, BAD_STEP, 2, 19), (1, BAD_STEP, 2, 19)], \
        job.events("nonfinite")
    [skipped] = job.events("batch_skipped")
    assert (skipped["generation"], skipped["step"], skipped["epoch"], skipped["batch"],
            skipped["skips"], skipped["max_skips"]) == (2, BAD_STEP, 2, 19, 1, 2), skipped
    assert [r["step"] for r in job.events("resumed")] == [80, 80], job.events("resumed")
    assert [(r["counted"], r.get("skipped", False)) for r in job.events("restart")] == \
        [(False, False), (False, True)], job.events("restart")
    # Exactly one batch dropped, the bad one: epoch 2 (from 0) trained one batch
    # fewer and no step after it went bad; the last epochs whole.
    assert epoch_batches(job, 2) == {2: STEPS_PER_EPOCH - 1, 3: 40, 4: 40, 5: 40}, \
        job.output[-3000:]
    assert "WEIGHTS_FINITE True" in job.output and "WEIGHTS_FINITE False" not in job.output
    assert "mgpu-launch: skipped batch 20 of epoch 3 (its loss went bad at step 100 " \
        "twice): not trained" in job.output, job.output[-3000:]
    assert "skipping batch 20 of epoch 3 (step 100): its loss went bad (non-finite, or a " \
        "spike rolled back) at that step twice" in job.output
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 2, summary
    assert [e["event"] for e in summary["nonfinite"]].count("batch_skipped") == 1, summary
    assert "skipping batch 20 of epoch 3" in render_status(load_run(job.run_dir))
    assert job.events("replay_passed") == [], job.events("replay_passed")  # the batch's
    done = [(e["generation"], e["epoch"], e["batch"], e.get("step"), e["done"])
            for e in job.events("batch_skip_done")]  # as the task did it
    assert done == [(2, 2, 19, BAD_STEP, True)], job.events("batch_skip_done")


@pytest.mark.e2e
def test_a_bad_batch_past_max_skips_stops_the_job_naming_the_batches_skipped(
        workdir, jobs):  # noqa: F811
    """Two bad batches, `max_skips: 1`: the first (step 100) is skipped; the
    second (step 140) comes back after a resume past the first, at its own
    step (the resume's drop counts the skipped batch's position), and stops."""
    config = cluster(workdir, "tf_keras", "env: {POISON_AT_STEP: '100,140'}\n"
                     "sentinel: {max_skips: 1}\n")
    job = launch(jobs, [str(config), "--no-live", NAN, str(workdir / "backup")], workdir)
    assert job.finish(timeout=500) == 1, job.output[-3000:]
    assert nonfinite(job) == [(0, 100, 2, 19), (1, 100, 2, 19), (2, 140, 3, 19),
                              (3, 140, 3, 19)], job.events("nonfinite")
    assert [r["step"] for r in job.events("resumed")] == [80, 80, 120], job.events("resumed")
    assert [e["batch"] for e in job.events("batch_skipped")] == [19]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "failed" and summary["stopped_by"] == "nonfinite", summary
    assert "the loss went non-finite at step 140 again" in summary["message"], summary
    assert "batch 20 of epoch 4 at step 140 is not skipped: sentinel.max_skips=1 bad batches " \
        "were skipped already (batch 20 of epoch 3 at step 100)" in summary["message"], summary


@pytest.mark.e2e
def test_a_loss_gone_bad_at_the_end_of_fit_keeps_the_backup_the_restart_resumes_from(
        workdir, jobs):  # noqa: F811
    # Step 239 of 240 goes bad: fit ends a step later, before the launcher stops
    # the generation, and BackupAndRestore deletes its backup when fit ends. The
    # backup (step 200, the last good save) is kept: the restart resumes there,
    # its input starts again from its first batch, and the job succeeds. The
    # script's code after fit (here a print of its weights' health) never runs
    # on the NaN weights of the generation rolled back: fit holds them back.
    config = cluster(workdir, "keras3", "env: {POISON_AT_STEP: 239}\n")
    job = launch(jobs, [str(config), "--no-live", NAN, str(workdir / "backup")], workdir)
    assert job.finish(timeout=300) == 0, job.output[-3000:]
    assert nonfinite(job) == [(0, 239, 5, 38)], job.events("nonfinite")
    assert [r["step"] for r in job.events("resumed")] == [200], job.events("resumed")
    assert read_summary(job.run_dir)["restarts"] == 1
    logs = "".join(log.read_text() for log in (job.run_dir / "logs").glob("*.log"))
    assert logs.count("WEIGHTS_FINITE True") == 2 and "WEIGHTS_FINITE False" not in logs, logs


@pytest.mark.e2e
def test_the_same_step_going_bad_after_its_free_restart_stops_the_job_naming_it(
        workdir, jobs):  # noqa: F811
    # Step 30 goes bad before the first save (step 40): its restart is free all
    # the same, and starts from scratch; step 30 goes bad again: the job stops,
    # with skips off (else its batch would be skipped: tf_keras, a carried input).
    config = cluster(workdir, "tf_keras", "env: {POISON_BY: step, POISON_AT_STEP: 30}\n"
                     "sentinel: {max_skips: 0}\n")
    job = launch(jobs, [str(config), "--no-live", "--max-restarts", "1", NAN,
                        str(workdir / "backup")], workdir)
    code = job.finish(timeout=300)
    assert code != 0, job.output[-3000:]
    assert [(g, step) for g, step, _, _ in nonfinite(job)] == [(0, 30), (1, 30)]
    [restart] = job.events("restart")
    assert restart["counted"] is False and restart["progress"] is False, restart
    assert "the first loss or weights gone non-finite, not counted" in job.output, \
        job.output[-3000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "failed" and summary["stopped_by"] == "nonfinite", summary
    assert "the loss went non-finite at step 30 again" in summary["message"], summary
    assert "batch 30 of epoch 1 at step 30 is not skipped: sentinel.max_skips is 0 " \
        "(`sentinel: {max_skips: 2}` skips up to 2 bad batches)" in summary["message"], summary
    assert not job.events("batch_skipped")
    assert "not succeeded" not in job.output and "job succeeded" not in job.output


@pytest.mark.e2e
def test_a_spike_rolls_back_when_asked(workdir, jobs):  # noqa: F811
    # A finite bad batch (values of 30) at step 100, once (generation 0 only):
    # a loss spike, not a NaN. With `on_spike: rollback` it is handled as a NaN
    # is: stopped, resumed from the save at step 80 (tf_keras: the input where
    # that save left it); the replay passes step 100: a one-off fault.
    config = cluster(workdir, "tf_keras", "env: {POISON_VALUE: '30', POISON_ONCE: '1'}\n"
                     "sentinel: {on_spike: rollback}\n")
    job = launch(jobs, [str(config), "--no-live", NAN, str(workdir / "backup")], workdir)
    assert job.finish(timeout=400) == 0, job.output[-3000:]
    spikes = [(e["generation"], e["step"], e["rollback"]) for e in job.events("loss_spike")]
    assert spikes == [(0, BAD_STEP, True)], job.events("loss_spike")
    assert [f["kind"] for f in job.events("failure_detected")] == ["nonfinite"]
    assert [r["step"] for r in job.events("resumed")] == [80], job.events("resumed")
    assert "its loss spiked to" in job.output and "WEIGHTS_FINITE True" in job.output
    status = render_status(load_run(job.run_dir))
    assert "loss spiked to" in status and f"at step {BAD_STEP} (epoch 3" in status, status
    [passed] = job.events("replay_passed")  # the same input at step 100, trained fine
    assert (passed["generation"], passed["step"], passed["exact"]) == (1, BAD_STEP, True)
    assert f"generation 1 trained past step {BAD_STEP}, where the loss went bad in " \
        "generation 0: a one-off fault, not its batch" in job.output, job.output[-3000:]


def test_sentinel_off_reaches_every_task_and_turns_the_hooks_off(monkeypatch):
    loaded = parse_config("transport: local\nsentinel: off\nhosts: [{address: 127.0.0.1}]\n")
    assert loaded.config.sentinel == "off"
    assert shared_env(loaded.config, "/ckpt", 0, 1)["MGPU_SENTINEL"] == "off"
    default = parse_config("transport: local\nhosts: [{address: 127.0.0.1}]\n")
    assert default.config.sentinel == "on"
    assert shared_env(default.config, "/ckpt", 0, 1)["MGPU_SENTINEL"] == "on"
    from launcher.runtime import sentinel

    monkeypatch.setenv("MGPU_PROGRESS_FD", "9")
    assert sentinel.enabled()
    monkeypatch.setenv("MGPU_SENTINEL", "off")
    assert not sentinel.enabled()


def test_the_events_are_said_counted_and_listed():
    bad = ev.Nonfinite(generation=1, task="worker1", host="host1", step=100, epoch=2, batch=19,
                       loss="inf")
    save = ev.NonfiniteSave(generation=1, task="worker0", host="host0", step=120,
                            directory="/ckpt/backup")
    assert narrate.line(bad) == ("notice", (
        "warning: host1/worker1's loss went inf at step 100 (epoch 3, batch 20 of it; "
        "generation 1): its weights and its peers' are NaN from there on; saves of "
        "non-finite weights are not counted as saves"))
    assert "saved non-finite weights of step 120 in /ckpt/backup" in narrate.line(save)[1]
    metrics = JobMetrics("nan", clock=lambda: 0.0)
    for event in (bad, save):
        metrics.tell(event)
    text = metrics.text()
    assert 'mgpu_nonfinite_total{job="nan",what="loss"} 1.0' in text, text
    assert 'mgpu_nonfinite_total{job="nan",what="save"} 1.0' in text, text
    assert 'mgpu_rollbacks_total{job="nan"} 0.0' in text, text
    # The generation stopped as `nonfinite`, restarted: one rollback (a crash's is none).
    for event in (ev.FailureDetected(generation=1, task="worker1", host="host1",
                                     failure="nonfinite"), ev.Restart(generation=2, restarts=1),
                  ev.FailureDetected(generation=2, task="worker1", host="host1", failure="exit"),
                  ev.Restart(generation=3, restarts=2)):
        metrics.tell(event)
    text = metrics.text()
    assert 'mgpu_rollbacks_total{job="nan"} 1.0' in text, text
    assert 'mgpu_job_restarts_total{job="nan"} 2.0' in text, text
    # A notification by default; `events:` may leave it out.
    assert notify.notification(bad) == "nonfinite" and notify.notification(save) is None
    assert "nonfinite" in NotifySettings(command="true").events
    story = Story()
    story.tell(bad)
    assert story.summary()["nonfinite"][0] == {"event": "nonfinite", **ev.fields_of(bad)}
    assert "nonfinite" not in Story().summary()  # absent when nothing went bad


def _failure(generation: int, kind: str = "nonfinite") -> Failure:
    return Failure(task="host0/worker0", host="host0", generation=generation, t=0.0, kind=kind,
                   reason="x")


def test_the_first_stop_is_free_and_the_same_step_again_ends_the_job():
    from launcher.job.detect.sentinel import Sentinel

    sentinel, told = Sentinel(lambda e: None), []
    sentinel._steps.update({0: 30, 1: 30})  # generation: its bad step, as heard
    # A first stop in the job: free, even without progress; a crash is not.
    assert sentinel.judged([_failure(0)]) == {"free": True}
    assert sentinel.judged([_failure(0, "exit")]) == {}
    budget = Budget(max_restarts=1)
    first = decide_restart(budget, advanced=False, preempted=False, free=True)
    assert first.restart and not first.counts and first.budget.spent == 0
    # The same step again, right after: the job stops, naming the step.
    judged = sentinel.judged([_failure(0), _failure(1)])
    assert "step 30 again" in judged["again"], judged
    again = decide_restart(first.budget, advanced=False, preempted=False, **judged)
    assert not again.restart and again.stopped_by == "nonfinite"
    assert again.message.startswith("gave up: the loss went non-finite at step 30 again")
    # Another step (a restart that starts the input again): restarted, and counted.
    sentinel._steps[1] = 180
    assert sentinel.judged([_failure(0), _failure(1)]) == {"free": False}
    told.append(ev.Restart(generation=1, counted=False, progress=False, max_restarts=1))
    assert "the first loss or weights gone non-finite, not counted against the 1 allowed" in \
        narrate.line(told[0])[1]


def test_a_replay_past_the_bad_step_is_told_once_unless_its_batch_is_skipped():
    from launcher.job.detect.sentinel import BatchSkip, Sentinel
    from launcher.job.record.reports import ProgressReport

    told: list[ev.Event] = []
    sentinel = Sentinel(told.append)
    sentinel._steps[0], sentinel._where[0] = 100, (2, 19, "")  # exact: a carried input
    sentinel._first[0] = "host1/worker1"
    sentinel._replayed(1, ProgressReport(step=140))  # a step past it: not yet (read late)
    for step in (80, 100, 120, 140):  # saves (checked finite) up to it: nothing; past: once
        sentinel._replayed(1, ProgressReport(step=step, saved=step))
    assert told == [ev.ReplayPassed(generation=1, step=100, first="host1/worker1", exact=True)]
    assert narrate.line(told[0])[1] == (
        "generation 1 trained past step 100, where the loss went bad in generation 0: a "
        "one-off fault, not its batch (the replay read the same input at that step); "
        "host1/worker1 reported it first (the loss is reduced across the workers: the device "
        "that made it may be any host's)")
    inexact = ev.ReplayPassed(generation=1, step=100, first="host1/worker1", exact=False)
    assert "whether it was one-off or its batch cannot be told" in narrate.line(inexact)[1]
    # A generation that went bad itself (at that step again: its weights finite, as
    # mixed precision's skipped update leaves them), or resumed past it: no replay.
    for went_bad, resumed in ((True, None), (False, 120)):
        other = Sentinel(told.append)
        other._steps[0] = 100
        if went_bad:
            other._steps[1] = 100
        other._replayed(1, ProgressReport(resumed=resumed))
        other._replayed(1, ProgressReport(step=140, saved=140))
        assert other._passed == set(), (went_bad, resumed)
    told.clear()
    # The same step bad twice, its batch skipped: passing it is the skip's doing.
    told.clear()
    sentinel._steps[1], sentinel._where[1] = 100, (2, 19, "")
    assert sentinel.judged([_failure(0), _failure(1)]) == {"skip": BatchSkip(2, 19, 100)}
    sentinel._replayed(2, ProgressReport(step=140, saved=140))
    assert told == []


def test_a_skip_as_the_task_did_it_is_told_once_per_position():
    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.reports import ProgressReport

    told: list[ev.Event] = []
    sentinel = Sentinel(told.append)
    ids = {"generation": 2, "task": "worker0", "host": "host0"}
    for _ in range(2):  # every worker says it; the first is told
        sentinel._skip_done(ProgressReport.read({"skip_done": [100, 2, 19]}), ids)
    sentinel._skip_done(ProgressReport.read({"skip_not": [7, 0, 3]}), ids)
    assert [narrate.line(e)[1] for e in told] == [
        "host0/worker0 skipped batch 20 of epoch 3 at step 100: read and dropped, not trained",
        "host0/worker0 trained batch 4 of epoch 1 at step 7, not skipped: another fit of the "
        "script at that position, not the step that went bad"]


# ------------------------------------------------------------------ spikes


def test_a_spike_is_far_above_its_window_and_a_healthy_wobble_is_not():
    import random

    from launcher.runtime.spikes import MIN_STEPS, SpikeWatch

    rng = random.Random(0)
    watch = SpikeWatch(window=64)
    # Noisy, falling fast, and a batch 3x the median: no spike.
    losses = [2.0 * 0.97 ** i * (1 + 0.3 * rng.random()) for i in range(300)]
    losses[200] *= 3
    assert [i for i, loss in enumerate(losses) if watch.add(loss)] == []
    spike = watch.add(50 * losses[-1])
    assert spike is not None and spike.z > 12 and spike.loss > 12 * spike.median
    # A loss that stays high is one spike, not one a step: the window follows it.
    assert not any(watch.add(50 * losses[-1]) for _ in range(200))
    # Too few steps to judge (a restart's empty window).
    fresh = SpikeWatch()
    assert not any(fresh.add(1.0) for _ in range(MIN_STEPS - 1)) and fresh.add(1000.0) is None
    assert fresh.add(1000.0) is not None  # now judged: a flat window, z inf
    # A step's own loss from the logged running means: k·m_k − j·m_j over k − j steps.
    from launcher.runtime.sentinel import step_loss

    assert step_loss((0, 0.0), 1, 2.0) == 2.0 and step_loss((2, 1.0), 3, 2.0) == 4.0
    assert step_loss((2, 1.0), 4, 2.0) == 3.0  # two steps logged at once: their mean


def _hear(spike: list[int], rollback: bool = False, running: bool = True):
    from types import SimpleNamespace

    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.reports import ProgressReport

    told: list[ev.Event] = []
    gen = SimpleNamespace(plan=SimpleNamespace(generation=0), failure=None,
                          phase=SimpleNamespace(running=running))
    sentinel = Sentinel(told.append)
    found = []
    for task in ("worker0", "worker1"):  # every worker logs the same reduced loss
        host = task.replace("worker", "host")
        record = SimpleNamespace(task=SimpleNamespace(name=task, host=host))
        said = ProgressReport.read({"loss_spike": spike, "loss_spike_loss": 91.5,
                                    "loss_spike_median": 0.25, "loss_spike_z": 40.0,
                                    **({"loss_spike_rollback": 1} if rollback else {})})
        found.append(sentinel.hear(gen, record, said))
    return sentinel, told, found


def test_a_spike_is_an_event_told_once_and_a_rollback_only_when_asked():
    _, told, found = _hear([100, 2, 19])
    [spike] = told
    assert isinstance(spike, ev.LossSpike) and (spike.step, spike.loss, spike.rollback) == \
        (100, 91.5, False) and found == [None, None]
    assert narrate.line(spike)[1] == (
        "warning: host0/worker0's loss spiked to 91.5 at step 100 (epoch 3, batch 20 of it; "
        "generation 0), 40 robust standard deviations above the median 0.25 of its recent "
        "steps: training goes on (`sentinel: {on_spike: rollback}` would roll it back)")
    sentinel, told, found = _hear([100, 2, 19], rollback=True)
    assert found[0] is not None and found[0].kind == "nonfinite" and found[1] is None
    assert sentinel.judged([_failure(0)]) == {"free": True}
    sentinel._steps[1], sentinel._spiked[1] = 100, "spiked"  # the replay's: same step
    assert "the loss spiked at step 100 again" in sentinel.judged(
        [_failure(0), _failure(1)])["again"]
    metrics, story = JobMetrics("nan", clock=lambda: 0.0), Story()
    metrics.tell(told[0])
    story.tell(told[0])
    assert 'mgpu_loss_spikes_total{job="nan"} 1.0' in metrics.text()
    assert story.summary()["loss_spikes"][0]["event"] == "loss_spike"
    assert "nonfinite" not in story.summary()  # a finite spike is not a non-finite loss
    assert notify.notification(told[0]) == "loss_spike"
    assert "loss_spike" not in NotifySettings(command="true").events  # not by default


def test_on_spike_extends_the_sentinel_key_and_reaches_every_task(monkeypatch):
    loaded = parse_config("transport: local\nsentinel: {on_spike: rollback, spike_z: 8}\n"
                          "hosts: [{address: 127.0.0.1}]\n")
    env = shared_env(loaded.config, "/ckpt", 0, 1)
    assert (env["MGPU_ON_SPIKE"], env["MGPU_SPIKE_Z"]) == ("rollback", "8.0")
    assert env["MGPU_SENTINEL"] == "on" and "MGPU_SPIKE_WINDOW" not in env
    from launcher.runtime import sentinel

    monkeypatch.setenv("MGPU_ON_SPIKE", "rollback")
    monkeypatch.setenv("MGPU_SPIKE_Z", "8.0")
    assert sentinel.on_spike() == "rollback" and sentinel.spike_watch().z == 8.0
    monkeypatch.setenv("MGPU_ON_SPIKE", "off")
    assert sentinel.spike_watch() is None
    monkeypatch.delenv("MGPU_ON_SPIKE")
    assert sentinel.on_spike() == "report"  # the default: an event, no rollback


def test_a_save_refused_after_a_spike_rollback_is_not_called_non_finite():
    """`on_spike: rollback`: the saves trained past the spike are refused though
    their weights are finite; said as that, not as "non-finite weights"."""
    from types import SimpleNamespace

    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.reports import ProgressReport

    told: list[ev.Event] = []
    gen = SimpleNamespace(plan=SimpleNamespace(generation=0), failure=None,
                          phase=SimpleNamespace(running=True))
    record = SimpleNamespace(task=SimpleNamespace(name="worker0", host="host0"))
    Sentinel(told.append).hear(gen, record, ProgressReport.read(
        {"saved_nonfinite": 120, "saved_dir": "/ckpt", "saved_after_spike": 1}))
    [refused] = told
    assert isinstance(refused, ev.NonfiniteSave) and refused.after_spike
    said = narrate.line(refused)[1]
    assert "weights trained past a loss spike that is rolled back" in said, said
    assert "non-finite" not in said


# ------------------------------------------------------------- a bad batch skipped


def _judged_twice(exact: dict, skipped=(), max_skips: int = 2, report: dict | None = None):
    """Sentinel.judged after generations 0 and 1 went bad at step 100 (epoch 2,
    batch 19), their tasks' reports (`report`: a NaN's) carrying `exact`."""
    from types import SimpleNamespace

    from launcher.job.detect.sentinel import Sentinel
    from launcher.job.record.reports import ProgressReport

    sentinel = Sentinel(lambda e: None, max_skips=max_skips)
    record = SimpleNamespace(task=SimpleNamespace(name="worker0", host="host0"))
    for generation in (0, 1):
        gen = SimpleNamespace(plan=SimpleNamespace(generation=generation), failure=None,
                              phase=SimpleNamespace(running=True))
        said = report or {"nonfinite": [100, 2, 19], "nonfinite_loss": "inf"}
        sentinel.hear(gen, record, ProgressReport.read({**said, **exact}))
    return sentinel.judged([_failure(0), _failure(1)], list(skipped))


def test_the_same_step_again_skips_its_batch_where_its_position_is_exact():
    from launcher.job.detect.sentinel import BatchSkip

    judged = _judged_twice({"nonfinite_exact": 1})
    assert judged == {"skip": BatchSkip(epoch=2, batch=19, step=100)}
    # The restart that skips it is free, whatever the budget spent.
    spent = Budget(max_restarts=1, spent=1)
    decision = decide_restart(spent, advanced=False, preempted=False, **judged)
    assert decision.restart and not decision.counts and decision.budget.spent == 1
    event = ev.BatchSkipped(generation=2, step=100, epoch=2, batch=19, skips=1, max_skips=2)
    assert narrate.line(event) == ("notice", (
        "skipping batch 20 of epoch 3 (step 100): its loss went bad (non-finite, or a spike "
        "rolled back) at that step twice, after a restart from the save before it; 1 of "
        "sentinel.max_skips=2"))
    restart = ev.Restart(generation=2, restarts=2, counted=False, skipped=True, max_restarts=1,
                         total=2)
    assert "(restart 2: a bad batch skipped, not counted against the 1 allowed" in \
        narrate.line(restart)[1]
    metrics, story = JobMetrics("nan", clock=lambda: 0.0), Story()
    metrics.tell(event)
    story.tell(event)
    assert 'mgpu_skipped_batches_total{job="nan"} 1.0' in metrics.text()
    assert story.summary()["nonfinite"] == [{"event": "batch_skipped", **ev.fields_of(event)}]
    # A spike rolled back (`on_spike: rollback`) that comes back at its step: the same.
    spike = {"loss_spike": [100, 2, 19], "loss_spike_loss": 91.5, "loss_spike_median": 0.25,
             "loss_spike_z": 40.0, "loss_spike_rollback": 1}
    assert _judged_twice({"nonfinite_exact": 1}, report=spike) == judged


def test_no_skip_stops_the_job_saying_why_and_naming_the_batches_skipped():
    from launcher.job.detect.sentinel import BatchSkip

    # Not exact: Keras 3 starts its input again; the task says why.
    keras3 = _judged_twice({"nonfinite_inexact": "the input's position is not carried here "
                                                 "(Keras 3)"})["again"]
    assert "step 100 again" in keras3 and "its batch is not skipped: the input's position " \
        "is not carried here (Keras 3): fix the data or the step" in keras3, keras3
    assert "not skipped: its task did not say" in _judged_twice({})["again"]  # an older runtime
    # Skips off: how to allow them.
    off = _judged_twice({"nonfinite_exact": 1}, max_skips=0)["again"]
    assert "batch 20 of epoch 3 at step 100 is not skipped: sentinel.max_skips is 0 " \
        "(`sentinel: {max_skips: 2}` skips up to 2 bad batches)" in off, off
    # Used up: every batch skipped named, and the one that came back.
    before = [BatchSkip(1, 3, 44), BatchSkip(1, 30, 71)]
    used = _judged_twice({"nonfinite_exact": 1}, skipped=before)["again"]
    assert "batch 20 of epoch 3 at step 100 is not skipped: sentinel.max_skips=2 bad " \
        "batches were skipped already (batch 4 of epoch 2 at step 44; batch 31 of epoch 2 " \
        "at step 71): fix the data or the step, then launch again, or allow more skips " \
        "(sentinel.max_skips)" in used, used
    decision = decide_restart(Budget(max_restarts=3), advanced=False, preempted=False,
                              again=used)
    assert not decision.restart and decision.stopped_by == "nonfinite"
    # A batch skipped already that comes back at its step: not that batch.
    again = _judged_twice({"nonfinite_exact": 1}, skipped=[BatchSkip(2, 19, 100)])["again"]
    assert "was skipped already, so the cause is not that batch" in again, again


def test_every_later_plan_carries_the_batches_skipped():
    from launcher.job.detect.sentinel import BatchSkip
    from launcher.job.policy.batchskips import with_skips
    from launcher.runtime.epochinput import skips_of
    from launcher.spec.config import local_config
    from launcher.spec.plan import build_plan

    plan = build_plan(local_config(2), ["train.py"], run_dir="/tmp/r", generation=2,
                      ports=list(range(30000, 30016)))
    assert with_skips(plan, []) is plan
    skipped = with_skips(plan, [BatchSkip(2, 19, 100), BatchSkip(3, 5, 126)])
    values = {task.env["MGPU_SKIP_BATCHES"] for task in skipped.tasks}
    assert values == {"2:19:100,3:5:126"} and len(skipped.tasks) == len(plan.tasks)
    assert skips_of(values.pop()) == {(2, 19), (3, 5)}  # as the task reads it
    assert all("MGPU_SKIP_BATCHES" not in task.env for task in plan.tasks)


def test_the_supervisor_skips_a_batch_that_comes_back_and_tells_later_generations(
        tmp_path: Path):
    from tests.fake_agents import harness

    bad = {0: [100, 2, 19], 1: [100, 2, 19], 2: [140, 3, 19], 3: [140, 3, 19]}

    def script(generation: int, name: str):
        if generation not in bad:
            return [(2.0, "exit", {"code": 0})]
        return [(1.0, "progress", {"data": {"step": 1}}),  # training
                (2.0, "progress", {"data": {"nonfinite": bad[generation],
                                            "nonfinite_loss": "inf", "nonfinite_exact": 1}})]

    h = harness(tmp_path, script, max_restarts=3)
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 4, result
    skips = [(e["generation"], e["epoch"], e["batch"], e["skips"])
             for e in h.events("batch_skipped")]
    assert skips == [(2, 2, 19, 1), (4, 3, 19, 2)], skips
    assert [e.get("skipped", False) for e in h.events("restart")] == [False, True, False, True]
    told = {m["generation"]: m["env"].get("MGPU_SKIP_BATCHES") for m in h.links["host1"].sent
            if m["op"] == "start"}
    assert told == {0: None, 1: None, 2: "2:19:100", 3: "2:19:100",
                    4: "2:19:100,3:19:140"}, told
    assert "skipping batch 20 of epoch 4 (step 140)" in h.output.getvalue()
