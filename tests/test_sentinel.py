"""The NaN sentinel (issue 52) as users meet it: a tutorial-shaped Keras `fit`
(its own BackupAndRestore, a save each epoch, no runtime calls) whose input
holds one batch of 1e30 at step 100 on worker 1, under two simulated hosts.

The loss is named at its step, epoch, batch and task (events.jsonl, the
terminal, `status`, summary.json), and no save after it is reported as a save
(launcher/runtime/sentinel.py, launcher/job/sentinel.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.job import events as ev
from launcher.job.story import Story
from launcher.spec.config import parse_config
from launcher.spec.taskenv import shared_env
from launcher.views import narrate
from launcher.views.metrics import JobMetrics
from launcher.views.records import load_run, render_status
from tests.conftest import SCRIPTS, read_summary
from tests.test_faults import Job, jobs, launch, write_yaml  # noqa: F401 - `jobs` is a fixture

NAN = str(SCRIPTS / "tutorial_nan.py")
BAD_STEP, STEPS_PER_EPOCH = 100, 40


def cluster(workdir: Path, keras: str, extra: str = "") -> Path:
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


def saves(job: Job) -> list[dict]:
    return [e for e in job.events("progress", generation=0) if "saved" in e]


def assert_named_at_the_step(job: Job) -> dict:
    [found] = job.events("nonfinite")  # the first of the generation
    # Keras logs the loss already reduced across the workers (its metrics read
    # in cross-replica context): every worker sees the bad step at once.
    assert found["generation"] == 0 and found["task"] in ("worker0", "worker1"), found
    assert found["host"] == found["task"].replace("worker", "host"), found
    assert found["step"] == BAD_STEP, found
    assert (found["epoch"], found["batch"]) == divmod(BAD_STEP - 1, STEPS_PER_EPOCH), found
    assert found["loss"] in ("inf", "nan"), found
    return found


@pytest.mark.e2e
@pytest.mark.parametrize("keras", ["tf_keras", "keras3"])
def test_a_loss_gone_bad_is_named_at_its_step_and_no_later_save_counts(
        workdir, jobs, keras):  # noqa: F811
    job = launch(jobs, [str(cluster(workdir, keras)), "--no-live", NAN,
                        str(workdir / "backup")], workdir)
    job.finish(timeout=300)
    assert "WEIGHTS_FINITE False" in job.output, job.output[-3000:]  # the script's own end
    found = assert_named_at_the_step(job)
    said = [line for line in job.output.splitlines()
            if f"{found['task']}'s loss went {found['loss']} at step {BAD_STEP}" in line]
    assert len(said) == 1 and "(epoch 3, batch 20 of it; generation 0)" in said[0], \
        job.output[-3000:]
    # The saves before the bad step stand; none after it is reported as a save.
    reported = saves(job)
    assert reported and all(s["saved"] < BAD_STEP for s in reported), reported
    assert [s["saved"] for s in reported if s["task"] == "worker0"] == [40, 80], reported
    [save] = job.events("nonfinite_save")
    assert save["step"] == 2 * STEPS_PER_EPOCH + STEPS_PER_EPOCH, save  # epoch 3's end
    status = render_status(load_run(job.run_dir))
    assert said[0].split("warning: ", 1)[1] in status, status
    assert "saved non-finite weights of step 120" in status, status
    summary = read_summary(job.run_dir)
    assert [e["event"] for e in summary["nonfinite"]] == ["nonfinite", "nonfinite_save"]
    assert summary["nonfinite"][0]["step"] == BAD_STEP, summary["nonfinite"]


def test_sentinel_off_reaches_every_task_and_turns_the_hooks_off(monkeypatch):
    loaded = parse_config("transport: local\nsentinel: off\nhosts: [{address: 127.0.0.1}]\n")
    assert loaded.config.sentinel == "off"
    assert shared_env(loaded.config, "/ckpt", 0, 1)["MGPU_SENTINEL"] == "off"
    default = parse_config("transport: local\nhosts: [{address: 127.0.0.1}]\n")
    assert default.config.sentinel == "on"
    assert "MGPU_SENTINEL" not in shared_env(default.config, "/ckpt", 0, 1)
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
    story = Story()
    story.tell(bad)
    assert story.summary()["nonfinite"][0] == {"event": "nonfinite", **ev.fields_of(bad)}
    assert "nonfinite" not in Story().summary()  # absent when nothing went bad
