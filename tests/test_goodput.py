"""The goodput ledger from recorded event lists (launcher/job/record/goodput.py): pure."""

from __future__ import annotations

import json

import pytest

from launcher.job.record import eventlines, goodput, story


def launch(t: float, generation: int = 0) -> dict:
    return {"t": t, "event": "launch", "v": 2, "generation": generation,
            "tasks": [{"task": "worker0", "host": "h0"}, {"task": "worker1", "host": "h1"}]}


def progress(t: float, step: int, generation: int = 0, task: str = "worker0", **more) -> dict:
    return {"t": t, "event": "progress", "v": 2, "generation": generation, "task": task,
            "host": "h0", "step": step, **more}


def event(t: float, name: str, **fields) -> dict:
    return {"t": t, "event": name, "v": 2, **fields}


def parts(records: list[dict], now: float | None = None) -> dict:
    ledger = goodput.from_records(records, now)
    assert ledger is not None
    assert sum(ledger["parts"].values()) == pytest.approx(ledger["wall_s"], abs=0.01)
    return ledger["parts"]


def test_a_clean_run_is_start_up_training_checkpoints_and_the_end():
    records = [launch(100)]
    records += [progress(110 + 10 * i, 10 * (i + 1)) for i in range(10)]  # 110..200
    records.insert(5, progress(150, 50, task="worker1", save_s=2.0))
    records.append(event(210, "job_done", status="succeeded", wall_s=112.0))
    got = parts(records)
    assert got["startup"] == pytest.approx(12)  # the launcher began 2 s before the launch
    assert got["checkpointing"] == pytest.approx(2)
    assert got["training"] == pytest.approx(88)
    assert got["other"] == pytest.approx(10)  # last step to the job's end
    assert got["redone"] == got["recovery"] == got["waiting_for_hosts"] == 0
    ledger = goodput.from_records(records)
    assert ledger["wall_s"] == pytest.approx(112) and ledger["productive_s"] == got["training"]


def test_a_fault_then_a_resume_from_an_earlier_checkpoint_is_recovery_then_redone():
    # Generation 0 trains steps 1..50 (t 110..150) and dies at 152; generation 1
    # restores step 20 (runtime.callbacks: its steps count from the resume point)
    # and trains past 50 at t 200 (global step 22 at 172, +1 step a second).
    records = [launch(100), *[progress(100 + 10 * i, 10 * i) for i in range(1, 6)],
               event(152, "failure_detected", generation=0, task="worker1", host="h1",
                     kind="crashed"),
               event(155, "teardown_begun", generation=0, why="failure"),
               launch(160, generation=1),
               progress(170, 0, generation=1, epoch=2, start_epoch=1, start_step=20)]
    records += [progress(172 + 4 * i, 2 + 4 * i, generation=1) for i in range(11)]  # ..212
    records.append(event(215, "job_done", status="succeeded", restarts=1, wall_s=115.0))
    steps = goodput.from_records(records)["steps"]
    assert steps == {"reached": 62, "generations": [
        {"generation": 0, "resumed_at": 0, "reached": 50, "redone": 0},
        {"generation": 1, "resumed_at": 20, "reached": 62, "redone": 30}]}
    got = parts(records)
    assert got["startup"] == pytest.approx(10)
    # At 1 step/s, steps 21..22 were trained from 170 on: 20..50 again, 170..200.
    assert got["recovery"] == pytest.approx(170 - 152)
    assert got["redone"] == pytest.approx(200 - 170)
    assert got["training"] == pytest.approx((152 - 110) + (212 - 200))
    assert got["other"] == pytest.approx(3)


def test_steps_read_off_the_optimizer_are_global_and_a_host_waited_for_is_its_own_part():
    records = [launch(0), progress(10, 100, counted=1), progress(20, 200, counted=1),
               event(25, "host_lost", generation=0, host="h1"),
               event(30, "host_wait", host="h1", timeout_s=60),
               event(50, "host_back", host="h1"),
               launch(55, generation=1),
               progress(60, 100, generation=1, counted=1),  # restored: no step yet
               progress(65, 150, generation=1, counted=1),  # 100..200 again
               progress(75, 250, generation=1, counted=1)]
    got = parts(records, now=80)  # running: no job_done yet
    assert got["waiting_for_hosts"] == pytest.approx(50 - 25)  # lost to back
    # 150 -> 250 in 10 s: 0.1 s a step, so steps 100..150 from 60, 200 reached at 70.
    assert got["recovery"] == pytest.approx(60 - 25 - 25)
    assert got["redone"] == pytest.approx(10)
    assert got["training"] == pytest.approx(15 + 10)  # 10..25, then 70..80 (now)
    assert got["startup"] == pytest.approx(10)


def test_a_short_redo_is_timed_at_the_step_rate_not_the_report_interval():
    # The case: saved at step 40, trained to 49 (reported), killed; the
    # restart restores 40 (`resumed`) and its first report, 2 s later, is past 49.
    records = [launch(0), progress(2, 40, counted=1, saved=40), progress(2.45, 49, counted=1),
               event(3, "failure_detected", generation=0, task="worker1", host="h1",
                     kind="crashed"),
               launch(5, generation=1), {**progress(8, 0, generation=1), "resumed": 40},
               progress(10, 80, generation=1, counted=1),
               progress(12, 120, generation=1, counted=1),
               event(12.5, "job_done", status="succeeded", restarts=1, wall_s=12.5)]
    del records[5]["step"]
    got = parts(records)
    assert got["redone"] == pytest.approx(9 * 0.05)  # was 0.0: the first report is past 49
    assert got["recovery"] == pytest.approx(8 - 3)  # 40 steps before t 10 at 0.05 s/step
    assert got["training"] == pytest.approx(3 - 2 + 12 - 8.45)  # to the fault, then on


def test_a_running_job_before_its_first_step_is_all_start_up_and_nothing_launched_is_none():
    assert parts([launch(100)], now=130)["startup"] == pytest.approx(30)
    assert goodput.from_records([], now=5) is None
    lines = [json.dumps(launch(100)), '{"t": 1', json.dumps(progress(104, 1))]
    # A half-written line is skipped (the story reads the file's lines so).
    read = story.fold(story.records(lines)).goodput(now=110)
    assert read["parts"]["training"] == pytest.approx(6)


def test_a_generation_that_failed_before_training_starts_the_recovery_at_its_fault():
    records = [launch(0), event(10, "failure_detected", generation=0, task="worker0",
                                 host="h0", kind="start_failed"),
               launch(20, generation=1), progress(30, 1, generation=1),
               progress(40, 11, generation=1),
               event(41, "job_done", status="succeeded", restarts=1, wall_s=41.0)]
    got = parts(records)
    assert got["startup"] == pytest.approx(10) and got["recovery"] == pytest.approx(20)
    assert got["training"] == pytest.approx(10) and got["redone"] == 0
    # Generation 1 never said where it resumed: its re-done steps are unknown, not 0.
    assert goodput.from_records(records)["steps"]["generations"] == [
        {"generation": 0, "resumed_at": 0, "reached": None, "redone": 0},
        {"generation": 1, "resumed_at": None, "reached": 11, "redone": None}]


def test_a_save_is_timed_once_and_rides_on_the_next_step_report(monkeypatch):
    import os
    import types

    from launcher import runtime
    from launcher.runtime import saves

    # The saves' clock, moved by the saves themselves: exact on a loaded machine.
    now = [100.0]
    monkeypatch.setattr(saves, "time", types.SimpleNamespace(monotonic=lambda: now[0]))

    class Manager:
        def save(self):
            now[0] += 0.05
            return self.write()

        def write(self):  # a save inside a save (tf_keras' backup, its manager)
            now[0] += 0.05
            return "ckpt-1"

    saves.timed(Manager, "save")
    saves.timed(Manager, "write")
    saves.take()
    read, write = os.pipe()
    monkeypatch.setenv("MGPU_PROGRESS_FD", str(write))
    assert Manager().save() == "ckpt-1"
    runtime.write_progress({"cluster": "joined"})  # no step: keeps the seconds
    runtime.write_progress({"step": 7})  # as the step counter reports
    os.close(write)
    with os.fdopen(read) as pipe:
        lines = [json.loads(line) for line in pipe]
    assert "save_s" not in lines[0]
    # 0.1 s: the inner save is not counted again (that would make it 0.15 s).
    assert lines[1]["step"] == 7 and lines[1]["save_s"] == pytest.approx(0.1), lines
    assert saves.take() == 0.0


def test_a_view_told_the_events_keeps_the_same_ledger_as_the_file_gives():

    records = [launch(0), progress(10, 1), progress(20, 11), event(21, "job_done",
                                                                  status="succeeded", wall_s=22)]
    book = goodput.Ledger()
    for record in records:  # told events carry no time: the view stamps it
        told = eventlines.from_record({k: v for k, v in record.items() if k != "t"})
        book.add(told, t=record["t"])
    assert book.result() == goodput.from_records(records)


def test_the_live_table_title_says_the_goodput_so_far():
    import io
    import time

    from launcher.job.record import events as ev
    from launcher.job.record.story import Beside
    from launcher.outlets.printer import Printer

    now = [100.0]
    out = io.StringIO()
    printer = Printer(["host0/worker0"], stream=out, colour=False, live=True,
                      size=lambda: (120, 20), clock=lambda: now[0])
    rows = [Beside(label="host0/worker0", generation=0, cpu_percent=None, rss_mb=None,
                   silent_s=0.0)]
    began = time.time() - 100  # a job that started 100 s ago, training for the last 50 s
    try:
        printer.tell(ev.Launch(generation=0, t=began))
        printer.tell(ev.Progress(generation=0, task="worker0", host="host0",
                                 metrics={"step": 1}, t=began + 50))
        printer.refresh(rows)
        printer.flush()
    finally:
        printer.close()
    assert "goodput 50 %" in out.getvalue(), out.getvalue()


def test_steps_redone_count_only_what_a_generation_trained_again():
    # Generation 1 resumes at 20 and dies at 30 (the job had reached 50): 10
    # steps trained again; generation 2 resumes at 20 and trains none.
    records = [launch(100), *[progress(100 + 10 * i, 10 * i) for i in range(1, 6)],
               event(152, "failure_detected", generation=0, task="worker1", host="h1",
                     kind="crashed"),
               launch(160, generation=1),
               progress(170, 0, generation=1, epoch=2, start_epoch=1, start_step=20),
               progress(175, 10, generation=1),
               event(180, "failure_detected", generation=1, task="worker1", host="h1",
                     kind="crashed"),
               launch(190, generation=2),
               progress(195, 0, generation=2, epoch=2, start_epoch=1, start_step=20),
               event(200, "job_done", status="failed", restarts=2, wall_s=100.0)]
    assert [(g["resumed_at"], g["reached"], g["redone"])
            for g in goodput.from_records(records)["steps"]["generations"]] == [
        (0, 50, 0), (20, 30, 10), (20, None, 0)]


def test_a_first_generation_that_restored_a_save_says_where():
    records = [launch(100), progress(105, 0, epoch=3, start_epoch=3, start_step=5000),
               progress(110, 20), event(120, "job_done", status="succeeded", wall_s=20.0)]
    assert goodput.from_records(records)["steps"] == {"reached": 5020, "generations": [
        {"generation": 0, "resumed_at": 5000, "reached": 5020, "redone": 0}]}
