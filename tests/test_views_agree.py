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
from launcher.job import goodput
from launcher.views import report, status_watch
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
    built = report.build(run)
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
