"""ParameterServerStrategy faults as a user meets them (issue 57 item 3): the
shape of TF's PS tutorial (`DatasetCreator`, the chief runs `fit` with
`ModelCheckpoint` and `BackupAndRestore`; 1 chief, 2 workers, 1 ps on two
simulated hosts) through the real CLI, a task killed with SIGKILL in epoch 2.

A worker killed is restarted alone and the job succeeds: that is a failure on
the record (events, `status` and `--json`, summary.json, the report, the
metrics' textfile, the notification, the terminal's last lines), and the
gRPC errors the chief prints while it restarts are one line in the terminal.
A ps killed restarts the job, which says where it resumed. Unit level:
tests/test_ps_record.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from launcher.outlets.rundir import load_run
from launcher.views import report as rep
from tests.conftest import (
    SCRIPTS,
    read_events,
    read_summary,
    run_cli,
    start_cli,
    status_json,
    wait_for,
)

pytestmark = pytest.mark.e2e

CLUSTER = """\
name: ps-tutorial
transport: local
strategy: parameter_server
keras: tf_keras
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: h0, roles: {chief: 1, ps: 1}}
  - {address: 127.0.0.1, name: h1, roles: {worker: 2}}
restart: {backoff_s: 0}
metrics: {textfile: ps.prom}
notify: {command: "cat >> notes.jsonl", events: [restarted]}
"""
REMOTELY = re.compile(r"Failed to (register|remove) function remotely")


def _kill_in_epoch_2(workdir: Path, victim: str) -> tuple[Path, subprocess.CompletedProcess]:
    (workdir / "ps.yaml").write_text(CLUSTER)
    run = workdir / "run"
    proc = start_cli(["--run-dir", str(run), "ps.yaml", str(SCRIPTS / "tutorial_ps_fit.py"),
                      str(workdir / "work"), "--epochs", "4", "--steps", "10",
                      "--epoch-s", "1"], cwd=workdir)
    try:
        wait_for(lambda: any(e["event"] == "progress" and e.get("task") == "chief0"
                             and (e.get("at_epoch") or 0) >= 1 for e in read_events(run)),
                 timeout=240, what="the chief in epoch 2")
        pid = [e["pid"] for e in read_events(run)
               if e["event"] == "task_started" and e["task"] == victim][-1]
        os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return run, subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_a_worker_killed_in_epoch_2_is_a_failure_on_the_record_and_restarted_alone(
        workdir: Path):
    run, done = _kill_in_epoch_2(workdir, "worker1")
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"h0/chief0 +\| FIT_DONE", out), out[-3000:]
    assert re.search(r"job succeeded in [^(]+ \(1 worker restarted alone\)", out), out[-3000:]
    assert "workers restarted alone (the job went on):" in out
    assert "failure: h1/worker1 (host h1, generation 0) killed (SIGKILL" in out
    # events: the failure, with its kind, as a task restart
    [again] = [e for e in read_events(run) if e["event"] == "task_restarted"]
    assert (again["task"], again["kind"], again["signal"]) == ("worker1", "signal", 9)
    # summary.json and status --json: a failure restarted alone, no root cause, no restart
    summary = read_summary(run)
    assert summary["status"] == "succeeded" and summary["restarts"] == 0
    assert summary["root_cause"] is None
    [failure] = summary["failures"]
    assert failure["task"] == "h1/worker1" and failure["restarted_alone"] is True
    assert failure["signal"] == 9 and "restarted alone" in failure["description"]
    status = status_json(run)
    assert status["failures"] == [failure] and status["root_cause"] is None
    tasks = {t["task"]: t for t in status["tasks"]}
    assert tasks["h1/worker1"]["restarted_alone"] == 1
    assert tasks["h1/worker0"].get("restarted_alone", 0) == 0  # said only when some
    text = run_cli(["status", str(run)], cwd=workdir).stdout
    assert "generation: 0 (1 worker restarted alone)" in text, text
    assert "workers restarted alone (the job went on):\n  h1/worker1 (host h1" in text, text
    # the report: the fault, restarted alone; the servers serving, not starting
    page = run_cli(["report", str(run), "-o", str(workdir / "r.html")], cwd=workdir)
    assert page.returncode == 0, page.stdout + page.stderr
    html = (workdir / "r.html").read_text()
    assert "no fault" not in html
    assert "signal: restarted alone <b>h1/worker1</b>" in html
    report = rep.build(load_run(run))
    for server in ("ps0", "worker0"):
        row = report.rows.index(server)
        states = [s.state for s in report.spans if s.row == row]
        assert states[:2] == ["starting", "serving"] and states.count("starting") == 1, states
    assert "<td>h0/ps0</td><td>ps</td><td>0</td><td>stopped</td>" in html
    # the metrics' textfile and the notification
    prom = (workdir / "ps.prom").read_text()
    assert re.search(r'mgpu_task_restarts_alone_total\{[^}]*task="worker1"[^}]*\} 1\.0', prom)
    [note] = [json.loads(line) for line in (workdir / "notes.jsonl").read_text().splitlines()]
    assert (note["notify"], note["event"], note["task"]) == ("restarted", "task_restarted",
                                                              "worker1")
    # the chief's gRPC errors while worker1 restarted: in its log, one line in the terminal
    logged = len(REMOTELY.findall((run / "logs" / "h0-chief0.log").read_text()))
    shown = len(REMOTELY.findall(out))
    if logged > 2:  # the chief tried to reach it while it restarted (not every run does)
        assert "lines of gRPC errors while h1/worker1 restarted alone" in out, out[-3000:]
        assert shown <= 2, out[-3000:]  # only those printed before the launcher heard of it


def test_a_ps_killed_in_epoch_2_restarts_the_job_which_says_where_it_resumed(workdir: Path):
    run, done = _kill_in_epoch_2(workdir, "ps0")
    out = done.stdout
    assert done.returncode == 0, out[-4000:]
    assert re.search(r"job succeeded in [^(]+ \(1 restart\)", out), out[-3000:]
    summary = read_summary(run)
    assert summary["failures"][0]["task"] == "h0/ps0"
    assert "restarted_alone" not in summary["failures"][0]
    [resumed] = summary["resumed"]
    assert resumed["generation"] == 1 and resumed["epoch"] >= 1 and resumed["step"] >= 10
    assert f"generation 1 resumed at epoch {resumed['epoch']} (step {resumed['step']})" in out
    assert status_json(run)["tasks"][0]["state"] == "succeeded"
