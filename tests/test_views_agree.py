"""One run directory, four views: `status`, `status --json`, the title of
`status --watch` and `mgpu-launch report` say the same of it (issue 38):

- a job still running (its launcher a live process): the goodput so far, the
  stragglers none so far, no summary.json named;
- a run whose launcher died without summary.json: aborted, its one failure not
  called a restart's cause, no summary.json named;
- a job that failed with `max_restarts: 0`, a notifier's failure written after
  its end: the job's length is its own, the rule that stopped it said in words.

Run directories written here as the launcher writes them; the views are the
real commands' code (status through its entry point, the watch on a text
stream, the report built and rendered).
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launcher.commands import status
from launcher.job.record import eventlines, goodput
from launcher.outlets import status_watch
from launcher.outlets.rundir import load_run
from launcher.views import report
from launcher.views.report_html import render

TASKS = [{"task": "worker0", "host": "host0"}, {"task": "worker1", "host": "host1"}]


def _write(run: Path, lines: list[dict], summary: dict | None = None) -> None:
    run.mkdir()
    (run / "config.yaml").write_text("name: agree\nstrategy: multi_worker_mirrored\n"
                                     "transport: local\n")
    (run / "events.jsonl").write_text("".join(json.dumps({"v": 2, **line}) + "\n"
                                              for line in lines))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))


def _launch(t: float, pid: int, host: str | None = None) -> dict:
    return {"t": t, "event": "launch", "generation": 0, "tasks": TASKS,
            "launcher_pid": pid, "launcher_host": host or socket.gethostname()}


def _training(t0: float, first: float, last: float, every: float = 10.0) -> list[dict]:
    lines = [{"t": t0 + 1, "event": "task_started", "generation": 0, **task, "pid": 1}
             for task in TASKS]
    step, t = 0, t0 + first
    while t <= t0 + last:
        step += 1
        lines += [{"t": t, "event": "progress", "generation": 0, **task, "step": step}
                  for task in TASKS]
        t += every
    return lines


def _views(run: Path, capsys, monkeypatch) -> dict:
    """What each view says of `run`."""
    assert status.main(["status", str(run)]) == 0
    text = capsys.readouterr().out
    assert status.main(["status", str(run), "--json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(status_watch, "ALIVE_EVERY_S", 0.1)
    screen = io.StringIO()
    status_watch.watch(run, screen, live=True, poll_s=0.05, alive=lambda _launch: False)
    built = report.build(load_run(run))
    return {"text": text, "json": as_json, "watch": screen.getvalue(), "report": built,
            "page": render(built)}


def _share(ledger: dict) -> str:
    return f"{100 * ledger['productive_s'] / ledger['wall_s']:.0f}"


def test_a_running_job_is_the_same_in_every_view(tmp_path: Path, capsys, monkeypatch):
    now = time.time()
    run = tmp_path / "running"
    # Its launcher on another machine (a shared run directory): running, as far as
    # anyone here can tell. Started 1000 s ago, training for the last 950 s: the
    # share holds at 95 % while the views look, one after another.
    _write(run, [_launch(now - 1000, 4242, host="another-machine"),
                 *_training(now - 1000, 50, 999)])
    seen = _views(run, capsys, monkeypatch)
    assert re.search(r"status:\s+running", seen["text"])
    assert "goodput 95 % (training 16 m, start-up 50 s)" in seen["text"]
    assert _share(seen["json"]["goodput"]) == "95"
    assert "- 2 running - goodput 95 % -" in seen["watch"]  # a text stream: ASCII rules
    assert _share(seen["report"].goodput) == "95"
    assert "<b>95.0 %</b>" in seen["page"]
    assert "none so far: no task was slower than its peers" in seen["page"]
    assert "<h2>Goodput</h2><p>productive" in seen["page"]  # not "not recorded"
    assert "summary:" not in seen["text"]


def test_a_run_without_summary_json_is_the_same_in_every_view(tmp_path: Path, capsys,
                                                              monkeypatch):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a launcher that is no more
    t0 = time.time() - 100
    run = tmp_path / "aborted"
    _write(run, [_launch(t0, gone.pid), *_training(t0, 10, 40),
                 {"t": t0 + 45, "event": "failure_detected", "generation": 0,
                  **TASKS[1], "kind": "signal", "signal": 9, "exit_code": None,
                  "reason": "was killed by signal 9 (SIGKILL)"}])
    seen = _views(run, capsys, monkeypatch)
    text = seen["text"]
    assert re.search(r"status:\s+aborted", text) and "(0 restarts)" in text
    assert "failures that caused a restart" not in text
    assert "failures of generation 0:\n  host1/worker1 (host host1, generation 0) was " \
        "killed by signal 9" in text
    assert "summary:" not in text and not (run / "summary.json").exists()
    assert seen["json"]["status"] == "aborted" == seen["report"].view.status
    # The watch ends with the same status as `status` itself.
    assert seen["watch"].rstrip().endswith(text.rstrip().splitlines()[-1])
    ledger = seen["json"]["goodput"]
    assert ledger == seen["report"].goodput and ledger["wall_s"] == pytest.approx(45.0)
    assert f"goodput {_share(ledger)} %" in text
    assert seen["report"].duration_s == pytest.approx(45.0)


def test_a_failed_job_with_events_after_its_end_is_the_same_in_every_view(
        tmp_path: Path, capsys, monkeypatch):
    t0 = time.time() - 100
    lines = [_launch(t0, 1), *_training(t0, 4, 10, every=2.0),
             {"t": t0 + 11, "event": "failure_detected", "generation": 0, **TASKS[1],
              "kind": "exit", "exit_code": 1, "signal": None,
              "reason": "exited with code 1"},
             {"t": t0 + 12.7, "event": "job_done", "status": "failed", "restarts": 0,
              "wall_s": 12.7, "stopped_by": "no_restarts", "message": ""},
             {"t": t0 + 40, "event": "notify_failed", "notify": "failed",
              "reason": "the command ran past notify.timeout_s (10 s): killed"}]
    failure = {"task": "host1/worker1", "host": "host1", "generation": 0, "kind": "exit",
               "description": "host1/worker1 (host host1, generation 0) exited with code 1"}
    ledger = goodput.from_records(lines)  # as the launcher writes it into the summary
    summary = {"status": "failed", "restarts": 0, "wall_s": 12.7, "root_cause": failure,
               "failures": [failure], "tasks": {}, "message": "",
               "stopped_by": "no_restarts", "goodput": ledger, "stragglers": []}
    run = tmp_path / "failed"
    _write(run, lines, summary)
    seen = _views(run, capsys, monkeypatch)
    detail = ("took 12.7 s; stopped by no_restarts: restart.max_restarts is 0: a failure is "
              "never restarted")
    assert f"status:     failed ({detail})" in seen["text"]
    assert seen["json"]["status_detail"] == detail == seen["report"].view.status_detail
    assert f"failed</span> {detail}" in seen["page"]
    assert seen["report"].duration_s == pytest.approx(12.7)  # not the notifier's 40 s
    assert ledger["wall_s"] == pytest.approx(12.7)
    assert seen["json"]["goodput"] == ledger == seen["report"].goodput
    assert f"goodput {_share(ledger)} %" in seen["text"]
    assert seen["watch"].rstrip().endswith(seen["text"].rstrip().splitlines()[-1])
    assert "failures that caused a restart" not in seen["text"]


# ----------------------------------------------------------- one story, every view


PHASES = ["starting", "running", "failing", "restarting", "starting", "running", "stopping"]


def _story_with_a_kill_a_restart_a_straggler_and_a_stop(t0: float) -> list[dict]:
    """Generation 0 trains to step 9; worker1 is killed (SIGKILL) and the job
    restarts; generation 1 resumes at step 8, names worker1 a straggler, trains
    to step 20 and is stopped (SIGTERM): the job ends interrupted. Each task's
    start sent (`task_starting`) and the job's phases (`job_phase`: PHASES) are
    told where the launcher tells them."""
    def task_line(t: float, name: str, generation: int, task: dict, **fields) -> dict:
        return {"t": t0 + t, "event": name, "generation": generation, **task, **fields}

    def phase(t: float, generation: int, name: str) -> dict:
        return {"t": t0 + t, "event": "job_phase", "generation": generation, "phase": name}

    w0, w1 = TASKS
    lines = [_launch(t0, 1), phase(0, 0, "starting")]
    lines += [task_line(0.5, "task_starting", 0, task) for task in TASKS]
    lines += [task_line(1, "task_started", 0, task, pid=100 + i)
              for i, task in enumerate(TASKS)]
    lines.append(phase(1, 0, "running"))
    for step in range(1, 10):
        lines += [task_line(2 + 2 * step, "progress", 0, task, step=step, loss=1.0 / step)
                  for task in TASKS]
    lines += [task_line(21, "task_exited", 0, w1, exit_code=None, signal=9,
                        stopped_by_launcher=False),
              phase(21.1, 0, "failing"),
              task_line(21.1, "failure_detected", 0, w1, kind="signal", exit_code=None,
                        signal=9, reason="was killed by signal 9 (SIGKILL)", at=t0 + 20.9,
                        last_lines=["step 9"]),
              {"t": t0 + 21.2, "event": "teardown_begun", "generation": 0, "why": "failure",
               "grace_s": 10.0},
              task_line(21.5, "task_exited", 0, w0, exit_code=None, signal=15,
                        stopped_by_launcher=True),
              {"t": t0 + 21.6, "event": "teardown_done", "generation": 0},
              phase(21.7, 0, "restarting"),
              {"t": t0 + 21.7, "event": "restart", "generation": 1, "restarts": 1,
               "counted": True, "progress": False, "hosts": ["host0", "host1"],
               "backoff_s": 1.0, "spent": 1, "max_restarts": 3, "total": 1,
               "max_total_restarts": 10, "preempted": False},
              {**_launch(t0 + 23, 1), "generation": 1}, phase(23, 1, "starting")]
    lines += [task_line(23.5, "task_starting", 1, task) for task in TASKS]
    lines += [task_line(24, "task_started", 1, task, pid=200 + i)
              for i, task in enumerate(TASKS)]
    lines.append(phase(24, 1, "running"))
    lines.append({"t": t0 + 26, "event": "resumed", "generation": 1, "step": 8})
    for step in range(9, 21):
        lines += [task_line(26 + 2 * (step - 8), "progress", 1, task, step=step,
                            loss=1.0 / step) for task in TASKS]
        if step == 15:
            lines.append(task_line(39, "straggler", 1, w1, slowdown=1.8,
                                   evidence={"unit": "ms_per_s",
                                             "task": {"waiting_for_cpu": 400.0},
                                             "peers": {"waiting_for_cpu": 10.0}},
                                   source="host", samples=3, action="warn"))
    lines += [{"t": t0 + 51, "event": "stop_requested", "generation": 1, "signal": 15,
               "grace_s": 10.0},
              phase(51, 1, "stopping"),
              {"t": t0 + 51.1, "event": "teardown_begun", "generation": 1, "why": "stop",
               "grace_s": 10.0},
              *(task_line(51.5, "task_exited", 1, task, exit_code=None, signal=15,
                          stopped_by_launcher=True) for task in TASKS),
              {"t": t0 + 51.6, "event": "teardown_done", "generation": 1},
              {"t": t0 + 51.7, "event": "job_done", "status": "interrupted", "restarts": 1,
               "wall_s": 51.7, "stopped_by": "", "message": "", "interrupted_by": 15}]
    return lines


def test_one_story_with_a_kill_a_restart_a_straggler_and_a_stop_is_the_same_everywhere(
        tmp_path: Path, capsys, monkeypatch):
    """One recorded event stream through every view: `status` (text, --json,
    --watch), the metrics, the live table, the report, the terminal's words and
    summary.json (written as the launch writes it: the story's rendering)."""
    from launcher.job.record import story
    from launcher.views import live, narrate
    from launcher.views.metrics import JobMetrics

    t0 = time.time() - 100
    lines = _story_with_a_kill_a_restart_a_straggler_and_a_stop(t0)
    told = story.fold(lines)
    summary = {**told.summary(), "goodput": told.goodput()}  # as job/run/launch.py writes it
    run = tmp_path / "story"
    _write(run, lines, json.loads(json.dumps(summary)))
    seen = _views(run, capsys, monkeypatch)
    metrics = JobMetrics("agree", clock=lambda: t0 + 51.7)
    phases = []  # the metrics' job state after each `job_phase` the launcher told
    for line in lines:
        metrics.tell(eventlines.from_record({"v": 2, **line}))
        if line["event"] == "job_phase":
            phases.append(_job_state(metrics))
    scraped = _scraped(metrics)
    rows = told.rows(t0 + 51.7)
    table = "\n".join(live.render(rows, width=200, height=40, elapsed_s=51.7, colour=False,
                                  rule="-", goodput=live.goodput_title(told.goodput())))

    # States and steps: every task stopped, at step 20.
    states = {"host0/worker0": "stopped", "host1/worker1": "stopped"}
    assert {t["task"]: t["state"] for t in seen["json"]["tasks"]} == states
    assert {label: t["state"] for label, t in summary["tasks"].items()} == states
    assert {r.label: r.state for r in rows} == states
    assert {t.label: t.state for t in seen["report"].view.tasks} == states
    for task, host in (("worker0", "host0"), ("worker1", "host1")):
        labels = (("host", host), ("job", "agree"), ("task", task))
        assert scraped[("mgpu_task_state", tuple(sorted((*labels, ("state", "stopped")))))] == 1
        assert scraped[("mgpu_task_step", labels)] == 20
        # (the live table names the straggler: `status --watch`'s as the launcher's own)
        shown = "stopped (straggler 1.8x)" if task == "worker1" else "stopped"
        assert re.search(rf"{host}\s+{task}\s+{re.escape(shown)}\s+20\b", seen["watch"])
        assert re.search(rf"{host}\s+{task}\s+{re.escape(shown)}\s+20\b", table)
        assert re.search(rf"{host}/{task}\s+worker \d\s+stopped\s+signal 15 \(SIGTERM\)\s+20",
                         seen["text"])
    assert {t["task"]: t["last_step"] for t in seen["json"]["tasks"]} == \
        {label: t["last_progress"]["step"] for label, t in summary["tasks"].items()} == \
        {r.label: r.step for r in rows} == {"host0/worker0": 20, "host1/worker1": 20}

    # The failure, in one sentence everywhere.
    sentence = "host1/worker1 (host host1, generation 0) was killed by signal 9 (SIGKILL)"
    failure = eventlines.from_record(next(line for line in lines
                                  if line["event"] == "failure_detected"))
    assert narrate.line(failure) == ("notice", f"failure: {sentence}")
    assert [f["description"] for f in seen["json"]["failures"]] == [sentence]
    assert [f["description"] for f in summary["failures"]] == [sentence]
    assert [f.description for f in seen["report"].faults] == [sentence]
    assert f"failures that caused a restart:\n  {sentence}" in seen["text"]
    assert summary["failures"][0]["last_lines"] == ["step 9"]
    assert summary["failures"][0]["t"] == pytest.approx(t0 + 20.9)  # as its host saw it
    assert summary["root_cause"] is None  # an interrupted job: the stop ended it

    # The restart and the stop.
    assert seen["json"]["restarts"] == summary["restarts"] == 1
    assert scraped[("mgpu_job_restarts_total", (("job", "agree"),))] == 1
    assert "generation: 1 (1 restart)" in seen["text"]
    assert "generation 1 (1 restart)" in table
    assert seen["json"]["status"] == summary["status"] == "interrupted"
    assert scraped[("mgpu_job_state", (("job", "agree"), ("state", "interrupted")))] == 1
    assert phases == PHASES and told.job_state == "interrupted"  # the phases, as told
    assert summary["interrupted_by"] == 15
    assert seen["json"]["status_detail"].endswith(", ended by SIGTERM"), seen["json"]
    assert "status:     interrupted (took " in seen["text"] and "SIGTERM)\n" in seen["text"]

    # The straggler.
    assert [(s["task"], s["slowdown"]) for s in summary["stragglers"]] == [("worker1", 1.8)]
    assert [(s["task"], s["slowdown"]) for s in seen["report"].stragglers] == \
        [("worker1", 1.8)]
    assert scraped[("mgpu_straggler_slowdown",
                    (("host", "host1"), ("job", "agree"), ("task", "worker1")))] == 1.8
    assert "straggler: host1/worker1 is 1.8x slower than its peers" in seen["text"]

    # The goodput.
    ledger = summary["goodput"]
    assert seen["json"]["goodput"] == ledger == seen["report"].goodput
    assert scraped[("mgpu_goodput_ratio", (("job", "agree"),))] == \
        pytest.approx(ledger["productive_s"] / ledger["wall_s"])
    assert f"goodput {_share(ledger)} %" in seen["text"]
    assert f"goodput {_share(ledger)} %" in table
    assert f"generation 1 (1 restart) - 2 stopped - goodput {_share(ledger)} %" in seen["watch"]
    assert seen["watch"].rstrip().endswith(seen["text"].rstrip().splitlines()[-1])

    # The drill's verdict input: the same model, told as the drill hears a job.
    from launcher.commands.drill_faults import Heard

    heard = Heard(clock=lambda: t0 + 1000)  # recorded events keep their own time
    for line in lines:
        heard.tell(eventlines.from_record({"v": 2, **line}))
    assert heard.detected(0) == pytest.approx(t0 + 21.1)  # the failure told
    assert heard.history.first_step(1) == pytest.approx(t0 + 28)  # generation 1's step 9
    assert heard.history.resumed_at(1) == summary["resumed"][0]["step"] == 8
    assert (heard.history.furthest(0), heard.history.furthest(1)) == (9, 20)
    assert heard.history.exits[(0, "worker1")].signal == 9
    assert not heard.history.finished_in(0, but="worker1")  # no peer ended its training
    assert heard.ended is not None and heard.ended.status == seen["json"]["status"]


def _scraped(metrics) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.text())
            for s in family.samples}


def _job_state(metrics) -> str:
    (state,) = [dict(labels)["state"] for (name, labels), value in _scraped(metrics).items()
                if name == "mgpu_job_state" and value == 1]
    return state


def test_the_same_story_cut_as_generation_1_starts_is_the_same_everywhere(
        tmp_path: Path, capsys, monkeypatch):
    """The same stream cut where generation 1's starts are sent and not yet
    answered (`task_starting`, then nothing): `status` (text, --json, --watch),
    the launcher's own table (a printer told the events, with the supervisor's
    own figures beside) and the metrics say both tasks are starting (from the
    fold: no view asks the supervisor), in the job's phase `starting`."""
    from launcher.job.record.story import Beside
    from launcher.outlets.printer import Printer
    from launcher.views.metrics import JobMetrics

    t0 = time.time() - 100
    lines = _story_with_a_kill_a_restart_a_straggler_and_a_stop(t0)
    head = lines[:max(i for i, line in enumerate(lines) if line["event"] == "task_starting") + 1]
    run = tmp_path / "cut"
    _write(run, head)
    seen = _views(run, capsys, monkeypatch)
    metrics = JobMetrics("agree", clock=lambda: t0 + 23.6)
    out = io.StringIO()
    printer = Printer([t["host"] + "/" + t["task"] for t in TASKS], stream=out, colour=False,
                      live=True, size=lambda: (200, 40))
    for line in head:
        metrics.tell(eventlines.from_record({"v": 2, **line}))
        printer.tell(eventlines.from_record({"v": 2, **line}))
    printer.refresh([Beside(label=f"{t['host']}/{t['task']}", generation=1, cpu_percent=12.0,
                            rss_mb=300.0, silent_s=0.1) for t in TASKS])
    assert printer.flush(timeout=10)
    printer.finish()
    table = out.getvalue()

    starting = {"host0/worker0": "starting", "host1/worker1": "starting"}
    assert {t["task"]: t["state"] for t in seen["json"]["tasks"]} == starting
    assert {t.label: t.state for t in seen["report"].view.tasks} == starting
    assert _job_state(metrics) == "starting"
    scraped = _scraped(metrics)
    for task, host in (("worker0", "host0"), ("worker1", "host1")):
        labels = (("host", host), ("job", "agree"), ("task", task))
        assert scraped[("mgpu_task_state", tuple(sorted((*labels, ("state", "starting")))))] == 1
        assert re.search(rf"{host}/{task}\s+worker \d\s+starting\b", seen["text"])
        # Step and loss kept from generation 0 (training resumes), no rate yet; the
        # CPU and memory the supervisor's.
        assert re.search(rf"{host}\s+{task}\s+starting\s+9\s+-\s+0.1111\s+12%\s+300 MB",
                         table), table
        assert re.search(rf"{host}\s+{task}\s+starting\s+9\b", seen["watch"])
    assert "generation 1 (1 restart)" in table and "2 starting" in table
