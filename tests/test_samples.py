"""Progress lines of events.jsonl at a bounded rate (launcher/job/run/samples.py): pure."""

from __future__ import annotations

from launcher.job.record import events as ev
from launcher.job.run.samples import EVERY_S, WHOLE_S, ProgressSampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def progress(step: int, task: str = "worker0", generation: int = 0, **more) -> ev.Progress:
    return ev.Progress(generation=generation, task=task, host="h0",
                       metrics={"step": step, **more})


def test_a_task_reporting_often_for_hours_writes_one_line_per_every_s():
    clock = Clock()
    sampler = ProgressSampler(clock=clock)
    written = sampler.lines(ev.Launch(generation=0))
    steps = 0
    hours = 6
    for _ in range(2 * 3600 * hours):  # runtime.callbacks(): two reports a second
        clock.now += 0.5
        steps += 1
        written += sampler.lines(progress(steps, save_s=0.01 if steps % 1000 == 0 else 0))
    lines = [e for e, _ in written if isinstance(e, ev.Progress)]
    # The first two minutes whole, then one per 30 s.
    assert len(lines) <= WHOLE_S * 2 + 3600 * hours / EVERY_S + 1, len(lines)
    assert len(lines) >= 3600 * hours / EVERY_S
    # Every save's seconds reach the file, on a later line.
    saved = sum(e.metrics.get("save_s", 0) for e in lines)
    clock.now += 1
    exited = sampler.lines(ev.TaskExited(generation=0, task="worker0", host="h0"))
    saved += sum(e.metrics.get("save_s", 0) for e, _ in exited if isinstance(e, ev.Progress))
    assert abs(saved - 0.01 * (steps // 1000)) < 1e-6
    # The last report held back is written when the task exits, at its own time.
    (last, at), (done, when) = exited
    assert last.metrics["step"] == steps and at == clock.now - 1
    assert isinstance(done, ev.TaskExited) and when is None


def test_the_first_report_of_each_generation_and_a_resume_point_are_always_written():
    clock = Clock()
    sampler = ProgressSampler(whole_s=0, every_s=30, clock=clock)
    assert sampler.lines(progress(1))  # the first step of generation 0
    clock.now += 1
    assert sampler.lines(progress(2)) == []
    assert sampler.lines(progress(0, generation=1, start_epoch=1, start_step=1))
    assert sampler.lines(progress(5, task="worker1"))  # each task its own line
    clock.now += 1
    (line, _), = sampler.lines(ev.JobDone(status="succeeded"))[:1]
    assert line.metrics["step"] == 2  # what was held back, at the job's end


def test_a_report_held_back_is_written_once_its_gap_has_passed():
    clock = Clock()
    sampler = ProgressSampler(whole_s=0, every_s=30, clock=clock)
    sampler.lines(progress(1))
    clock.now += 0.01
    assert sampler.lines(progress(2)) == [] and sampler.lines(progress(3)) == []
    clock.now += 10
    assert sampler.due() == []  # 30 s between two lines of a task
    clock.now += 20
    (line, at), = sampler.due()  # the task went quiet: its last report, at its own time
    assert line.metrics["step"] == 3 and at == clock.now - 30
    assert sampler.due() == [] and sampler.lines(progress(4)) == []


def test_while_a_generation_is_young_every_epoch_end_is_written():
    clock = Clock()
    sampler = ProgressSampler(clock=clock)
    sampler.lines(progress(1))
    clock.now += 0.001
    assert sampler.lines(progress(2, epoch_end=1, checkpoint=1))
    assert sampler.lines(progress(3)) == []


def test_a_held_step_is_written_before_a_mark_that_has_no_step():
    # A fit's last epoch: its save at step 30 (written), the epoch's loss at
    # step 30 a millisecond later (held: within the floor), then the backup
    # deleted at fit's end (a mark, no step): the loss line is not lost, so
    # the run's model (status, summary.json) ends on it.
    clock = Clock()
    sampler = ProgressSampler(clock=clock)
    sampler.lines(ev.Launch(generation=0))
    assert sampler.lines(progress(30, checkpoint=1, saved=30))
    clock.now += 0.001
    assert sampler.lines(progress(30, loss=0.25)) == []
    clock.now += 0.001
    deleted = ev.Progress(generation=0, task="worker0", host="h0", metrics={"deleted": "/b"})
    (loss, at), (mark, when) = sampler.lines(deleted)
    assert loss.metrics["loss"] == 0.25 and at == round(clock.now - 0.001, 6)
    assert mark is deleted and when is None
