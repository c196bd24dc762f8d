"""The training's history in the run's model (launcher/job/record/history.py): what
the drill judges a fault by, folded from events.jsonl's lines as the
runtime and the bootstrap write them (pure: no job)."""

from __future__ import annotations

from launcher.job.record import history, story


def _progress(t: float, generation: int, task: str, **metrics) -> dict:
    return {"v": 2, "t": t, "event": "progress", "generation": generation, "task": task,
            "host": "host0", **metrics}


def test_steps_resume_points_and_saves_as_the_drill_reads_them():
    lines = [
        # Generation 0: worker1 runs ahead and reports a save before the saver.
        _progress(1.0, 0, "worker1", step=5, checkpoint=True),
        _progress(1.1, 0, "worker0", step=4),
        _progress(2.0, 0, "worker0", step=10, saved=10, save_s=0.4, chief=True),
        _progress(2.1, 0, "worker1", step=12, checkpoint=True),  # a peer: no longer counts
        _progress(2.2, 0, "worker0", step=10, checkpoint=True, saved=10),  # the same save
        {"v": 2, "t": 3.0, "event": "task_exited", "generation": 0, "task": "worker1",
         "host": "host0", "exit_code": None, "signal": 9, "stopped_by_launcher": False},
        # Generation 1: runtime.callbacks() restored step 10, then counts from 0.
        _progress(5.0, 1, "worker0", step=0, start_epoch=1, start_step=10),
        _progress(6.0, 1, "worker0", step=3),
        {"v": 2, "t": 7.0, "event": "task_exited", "generation": 1, "task": "worker1",
         "host": "host0", "exit_code": 0, "signal": None, "stopped_by_launcher": False},
        # Generation 2: a script that reports no steps, read off its optimizer.
        _progress(8.0, 2, "worker0", step=13, counted=True, resumed=13),
        _progress(10.0, 2, "worker0", step=13, counted=True),
        _progress(12.0, 2, "worker0", step=17, counted=True),
    ]
    told = story.Story(history=history.History(keep_reports=True))  # as the drill keeps it
    for line in lines:
        told.tell(story.eventlines.from_record(line))
    told = told.history
    assert [(s.step, s.generation, s.by_saver) for s in told.saves] == [(10, 0, True)]
    assert told.saves_reported and told.save_seconds == [0.4]
    assert (told.furthest(0), told.furthest(1), told.furthest(2)) == (12, 13, 17)
    assert told.first_step(0) == 1.0 and told.resumed_at(0) is None
    assert (told.first_step(1), told.resumed_at(1)) == (6.0, 10)  # its offset: absolute
    assert (told.first_step(2), told.resumed_at(2)) == (12.0, 13)  # the count moved
    assert told.exits[(0, "worker1")].signal == 9 and not told.finished_in(0, but="worker0")
    assert told.finished_in(1, but="worker0") and not told.finished_in(1, but="worker1")
    assert told.trained_since(0, "worker1", 2.0) and not told.trained_since(0, "worker1", 2.1)
    # One task's reports per generation up to its fault: one that says a save first.
    assert told.series({0: 2.1}) == [[(1.0, 5, True)],
                                     [(6.0, 13, False)],
                                     [(8.0, 13, False), (10.0, 13, False), (12.0, 17, False)]]


def test_a_long_run_keeps_a_bounded_history():
    kept, live = story.Story(history=history.History(keep_reports=True)), story.Story()
    for step in range(history.POINTS_KEPT + 10):
        event = story.eventlines.from_record(_progress(float(step), 0, "worker0", step=step))
        kept.tell(event)
        live.tell(event)
    points = kept.history.points[(0, "worker0")]
    assert len(points) == history.POINTS_KEPT and points[0][1] == 10
    assert live.history.points == {}  # the live views' story keeps no reports
    for told in (kept.history, live.history):
        assert told.furthest(0) == history.POINTS_KEPT + 9
        assert told.trained_since(0, "worker0", history.POINTS_KEPT + 8.5)
