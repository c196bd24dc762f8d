"""`mgpu-launch report RUN_DIR`: one self-contained HTML file of a run.

The charts are pure functions (launcher/views/svg.py), tested as text; the
report is built from a recorded run of the old format, from a run directory
with goodput and stragglers, and from a real `--local 2` job whose worker is
killed with SIGKILL and restarted; that one is rendered in a real headless
Chromium (Debian's `chromium`) with the network shut: a screenshot with
something on it, and no console message (a CSP violation or a failed load
would be one).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from launcher.commands import report as report_command
from launcher.job.record import events as ev
from launcher.job.record import story
from launcher.outlets.rundir import load_run
from launcher.views import report as rep
from launcher.views import svg
from launcher.views.report_html import render
from tests.conftest import REPO, SCRIPTS, alive, read_events, run_cli, start_cli, wait_for

RUN_V1 = REPO / "tests" / "data" / "run_v1"
HOSTILE = "<script>alert('x')</script>&"


# ------------------------------------------------------------------- charts


def test_ticks_are_round_and_cover_the_range():
    assert svg.nice_ticks(0, 10) == [0, 2, 4, 6, 8, 10]
    assert svg.nice_ticks(0, 2.5) == [0, 0.5, 1, 1.5, 2, 2.5]
    assert svg.nice_ticks(0, 2.5, 5) == [0, 1, 2]
    assert svg.nice_ticks(3, 3) == [3]


def test_charts_escape_what_the_run_wrote():
    chart = svg.timeline([HOSTILE, "job"], [svg.Span(0, 0.0, 2.0, "training", HOSTILE)],
                         [svg.Mark(0, 1.0, "1", HOSTILE)], t1=4.0)
    assert "<script>" not in chart and "&lt;script&gt;" in chart
    assert chart.count('fill="#3c9a5f"') == 2  # the training span and its legend
    lines = svg.line_chart({HOSTILE: [[(0.0, 1.0), (1.0, 2.0)], [(3.0, 2.0)]]}, 4.0, "steps/s")
    assert "<script>" not in lines and lines.count(" M ") == 1  # two pieces: a gap between
    bar = svg.stacked_bar([("training", 3.0, "#3c9a5f"), (HOSTILE, 1.0, "#999")])
    assert "<script>" not in bar and "training: 3.0 s (75 %)" in bar


# ------------------------------------------------------------------ reports


def test_a_recorded_run_of_the_old_format(tmp_path: Path, capsys):
    """run_v1 has no `v`, no command, no versions, no goodput: said, not guessed."""
    run = tmp_path / "run"
    shutil.copytree(RUN_V1, run)
    assert report_command.main(["report", str(run)]) == 0
    out = run / "report.html"
    assert capsys.readouterr().out.strip() == str(out)
    assert out.stat().st_mode & 0o077 == 0  # user-only: it holds what the logs hold
    page = out.read_text()
    assert "worker0 (host0)" in page and "worker1 (host1)" in page
    assert "root cause <b>host1/worker1</b>" in page
    assert "FileNotFoundError: [Errno 2] No such file or directory" in page
    assert page.count("not recorded") >= 4  # command, goodput, stragglers, versions
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_the_job_row_names_the_generation_it_restarts_as(tmp_path: Path):
    """A restart's span on the job's row (issue 53 item 5): no "generation -1"."""
    run = tmp_path / "run"
    shutil.copytree(RUN_V1, run)  # a worker failed in generation 0, restarted as 1
    report = rep.build(load_run(run))
    restart = next(s for s in report.spans if s.state == "restarting")
    assert restart.title.startswith("job: restarting as generation 1, "), restart.title
    assert "generation -1" not in render(report)


def test_goodput_stragglers_and_the_cluster_when_recorded(tmp_path: Path):
    run = _fixture_run(tmp_path)
    page = render(rep.build(load_run(run)))
    # The story's ledger (summary.json holds the same): 6 s to the first report,
    # 17 s of training to the last, then nothing reported until the job's end.
    assert "productive 17.0 s of 100.0 s: <b>17.0 %</b>" in page
    assert "waiting_for_hosts" in page and "startup: 6.0 s (6 %)" in page
    assert "other: 77.0 s (77 %)" in page
    assert "1.80x" in page and "input_wait_ms" in page  # the straggler and its evidence
    assert "2.16.1" in page and "3.11.2" in page  # versions from the agents' hellos
    assert "train.py &#x27;&lt;script&gt;alert(" in page  # the command, escaped
    assert "<script>" not in page
    assert "not recorded" not in page


def test_a_run_still_going_is_reported_up_to_now(tmp_path: Path):
    run = _fixture_run(tmp_path)
    (run / "summary.json").unlink()
    events = (run / "events.jsonl").read_text().splitlines()
    (run / "events.jsonl").write_text("\n".join(events[:-1]) + "\n")  # no job_done yet
    at = report_t0(run) + 40.0
    report = rep.build(load_run(run, now=at), now=at)
    assert report.view.status == "running" and report.duration_s == pytest.approx(40.0)
    training = [s for s in report.spans if s.state == "training"]
    assert {s.row for s in training} == {0, 1} and all(s.end == 40.0 for s in training)
    page = render(report)
    # The goodput so far, as `status` says it at the same moment.
    assert report.goodput == load_run(run, now=report_t0(run) + 40.0).goodput
    assert report.goodput["wall_s"] == pytest.approx(40.0, abs=1.0)
    assert "productive" in page and "not recorded" not in page
    assert "1.80x" in page  # the straggler, from its event


def report_t0(run: Path) -> float:
    return json.loads((run / "events.jsonl").read_text().splitlines()[0])["t"]


def test_steps_per_second_per_generation():
    def progress(t: float, generation: int, **metrics) -> ev.Progress:
        return ev.Progress(t=t, generation=generation, task="worker0", host="h", metrics=metrics)

    events = [progress(1.0, 0, step=10), progress(2.0, 0, step=30), progress(3.0, 0, step=50),
              progress(6.0, 1, step=40), progress(8.0, 1, step=60),
              progress(9.0, 1, steps_per_s=7.5)]
    assert rep._rates(events, t0=0.0) == {"worker0": [[(2.0, 20.0), (3.0, 20.0)],
                                                      [(8.0, 10.0), (9.0, 7.5)]]}
    assert rep._rates(events, t0=0.0, min_gap_s=2.0)["worker0"][0] == [(3.0, 20.0)]


def test_a_missing_run_dir_or_output_is_a_usage_error(tmp_path: Path, capsys):
    assert report_command.main(["report", str(tmp_path / "nope")]) == 2
    assert "mgpu-launch report: " in capsys.readouterr().err
    run = _fixture_run(tmp_path)
    assert report_command.main(["report", str(run), "-o", str(tmp_path / "no" / "r.html")]) == 2
    assert "cannot write" in capsys.readouterr().err


def _fixture_run(tmp_path: Path) -> Path:
    run = tmp_path / "fixture"
    run.mkdir()
    (run / "config.yaml").write_text(
        "name: fx\nstrategy: multi_worker_mirrored\ntransport: local\nhosts:\n"
        "- {address: 127.0.0.1, name: host0, roles: {worker: 1}}\n"
        "- {address: 127.0.0.1, name: host1, roles: {worker: 1}}\n")
    ids = [{"task": "worker0", "host": "host0"}, {"task": "worker1", "host": "host1"}]
    facts = [{"host": h, "hostname": "box", "mgpu_launch": "0.1.0", "python": "3.11.2",
              "tensorflow": "2.16.1", "keras": "3.3.3", "tf_keras": None}
             for h in ("host0", "host1")]
    lines = [{"t": 0.0, "event": "launch", "v": 2, "generation": 0, "tasks": ids,
              "command": ["train.py", HOSTILE], "hosts": facts}]
    for step in range(1, 11):
        for task in ids:
            lines.append({"t": 5.0 + step * (1.8 if task["task"] == "worker1" else 1.0),
                          "event": "progress", "v": 2, "generation": 0, **task, "step": step})
    lines.append({"t": 30.0, "event": "straggler", "v": 2, "generation": 0, **ids[1],
                  "slowdown": 1.8, "evidence": {"input_wait_ms": 800}})
    lines.append({"t": 100.0, "event": "job_done", "v": 2, "status": "succeeded"})
    (run / "events.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {"status": "succeeded", "restarts": 0, "wall_s": 100.0, "root_cause": None,
               "failures": [], "tasks": {},
               "goodput": story.fold(lines).goodput(),  # as the launch writes it
               "stragglers": [{"task": "host1/worker1", "host": "host1", "slowdown": 1.8,
                               "evidence": {"input_wait_ms": 800}}]}
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_a_loss_gone_bad_is_marked_at_its_step_and_rendered(tmp_path: Path):
    """The NaN sentinel's `nonfinite` (issue 52 item 4): a mark on the timeline at
    the task and moment the bad step was heard, its words under the chart; the
    page renders in a real Chromium with no console message."""
    run = _fixture_run(tmp_path)
    lines = (run / "events.jsonl").read_text().splitlines()
    ids = {"generation": 0, "task": "worker1", "host": "host1"}
    bad = [{"t": 20.0, "event": "nonfinite", "v": 2, **ids, "step": 100, "epoch": 1,
            "batch": 19, "loss": "nan"},
           {"t": 20.5, "event": "failure_detected", "v": 2, **ids, "kind": "nonfinite",
            "reason": "its loss went nan at step 100"},
           {"t": 22.0, "event": "restart", "v": 2, "generation": 1, "restarts": 1}]
    (run / "events.jsonl").write_text("\n".join([*lines[:-1], *map(json.dumps, bad),
                                                 lines[-1]]) + "\n")
    report = rep.build(load_run(run))
    [mark] = report.losses
    assert (mark.row, mark.t, mark.label) == (report.rows.index("worker1"), 20.0, "!")
    assert "loss went nan at step 100 (epoch 2, batch 20 of it" in mark.title
    assert report.marks[0] == mark and len(report.marks) == 2  # and the fault's
    page = render(report)
    assert "purple !</span> is the step whose loss went non-finite" in page
    assert "<h3>Loss</h3>" in page and page.count(rep.LOSS_COLOR) >= 2
    out = run / "report.html"
    out.write_text(page)
    screenshot, console = _chromium(out, tmp_path / "shot.png")
    assert console == [], console
    _assert_not_blank(screenshot)


# ------------------------------------------------------- a real run, rendered


@pytest.mark.e2e
def test_a_killed_and_restarted_job_reported_and_rendered(workdir: Path):
    run = workdir / "run"
    proc = start_cli(["--run-dir", str(run), "--local", "2", str(SCRIPTS / "fault_steps.py"),
                      "--steps", "30", "--step-s", "0.1"], cwd=workdir)
    pids: set[int] = set()
    try:
        wait_for(lambda: [e for e in read_events(run) if e["event"] == "progress"
                          and e["task"] == "worker1" and e["generation"] == 0
                          and e.get("step", 0) >= 5], timeout=60, what="worker1 at step 5")
        victim = _pid(run, 0, "worker1")
        pids.add(victim)
        os.kill(victim, signal.SIGKILL)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        pids |= {e["pid"] for e in read_events(run) if e["event"] == "task_started"}
    assert proc.returncode == 0, output[-3000:]
    out = workdir / "out" / "report.html"
    out.parent.mkdir()
    done = run_cli(["report", str(run), "-o", str(out)], cwd=workdir, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(out), done.stderr
    page = out.read_text()
    assert "worker0 (host0)" in page and "worker1 (host1)" in page
    assert "root cause <b>host1/worker1</b>" in page and "killed (SIGKILL" in page
    assert "fault_steps.py --steps 30 --step-s 0.1" in page  # the command that ran
    report = rep.build(load_run(run))
    restart = next(s for s in report.spans if s.state == "restarting")
    assert restart.start == pytest.approx(report.faults[0].t)
    assert {s.row for s in report.spans if s.state == "training" and s.start > restart.end} \
        == {0, 1}  # generation 1 trained on both tasks
    assert "steps/s" in page and "<h2>Cluster</h2>" in page
    screenshot, console = _chromium(out, workdir / "shot.png")
    assert console == [], console
    _assert_not_blank(screenshot)
    wait_for(lambda: not alive(pids), timeout=10, what="every task of the job to exit")


def _pid(run: Path, generation: int, task: str) -> int | None:
    return next((e["pid"] for e in read_events(run) if e["event"] == "task_started"
                 and e["generation"] == generation and e["task"] == task), None)


def _chromium(page: Path, png: Path) -> tuple[Path, list[str]]:
    """Render `page` in headless Chromium, no network; (the screenshot, its console lines)."""
    done = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
         f"--screenshot={png}", "--window-size=1100,1400", page.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return png, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def _assert_not_blank(png: Path) -> None:
    from PIL import Image

    with Image.open(png) as image:
        pixels = image.convert("RGB").resize((110, 140))
        colours = pixels.getcolors(110 * 140) or []
    inked = sum(count for count, rgb in colours if rgb != (255, 255, 255))
    assert len(colours) > 10 and inked > 0.03 * 110 * 140, (len(colours), inked)
