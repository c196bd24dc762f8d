"""Notifications: `notify: {command, events, timeout_s}` (launcher/outlets/notify.py).

A real job (`transport: local`) that fails once and then succeeds runs a real
shell command for each notification; the notifier alone is tested with real
commands that hang, fail and pile up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from launcher.job.record import eventlines
from launcher.job.record import events as ev
from launcher.outlets import notify
from launcher.spec.outlets import NotifySettings
from tests.conftest import read_events, run_cli, wait_for

# Fails in generation 0, succeeds in generation 1.
SCRIPT = "import os, sys\nsys.exit(1 if os.environ['MGPU_GENERATION'] == '0' else 0)\n"


def test_a_job_notifies_its_restart_and_end_and_a_failing_command_is_recorded(workdir: Path):
    (workdir / "job.py").write_text(SCRIPT)
    command = ('cat >> notes.jsonl; echo "$MGPU_EVENT $MGPU_JOB $MGPU_RUN_DIR" >> env.txt; '
               '[ "$MGPU_EVENT" != restarted ] || { echo webhook down >&2; exit 3; }')
    (workdir / "cluster.yaml").write_text(
        "name: demo\ntransport: local\nhosts: [{address: 127.0.0.1}]\n"
        "restart: {backoff_s: 0}\n"
        f"notify: {{command: {json.dumps(command)}, timeout_s: 10}}\n")
    result = run_cli(["--no-live", "--run-dir", "run", "cluster.yaml", "job.py"], cwd=workdir,
                     timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr  # a failed command: not fatal
    notes = [json.loads(line) for line in (workdir / "notes.jsonl").read_text().splitlines()]
    assert [(n["notify"], n["event"]) for n in notes] == \
        [("restarted", "restart"), ("succeeded", "job_done")]
    assert notes[1]["status"] == "succeeded" and notes[1]["job"] == "demo"
    run_dir = workdir / "run"
    assert notes[1]["run_dir"] == str(run_dir)
    assert (workdir / "env.txt").read_text().splitlines() == \
        [f"restarted demo {run_dir}", f"succeeded demo {run_dir}"]
    failed = [e for e in read_events(run_dir) if e["event"] == "notify_failed"]
    assert len(failed) == 1 and failed[0]["notify"] == "restarted"
    assert failed[0]["exit_code"] == 3 and "webhook down" in failed[0]["reason"]
    assert "notification 'restarted': the command exited with 3: webhook down" \
        in result.stdout


def _notifier(tmp_path: Path, command: str, **settings) -> tuple[notify.Notifier, list]:
    recorded: list[ev.Event] = []
    notifier = notify.Notifier(NotifySettings(command=command, **settings), "demo", tmp_path)
    notifier.open(recorded.append)
    return notifier, recorded


def test_a_hanging_command_never_holds_up_the_supervisor_and_is_killed(tmp_path: Path):
    notifier, recorded = _notifier(tmp_path, "sleep 30 & sleep 30; wait", timeout_s=0.5,
                                   events=["failed"])
    started = time.monotonic()
    notifier.tell(ev.JobDone(status="failed"))
    notifier.tell(ev.Restart(generation=1))  # not chosen below: not run
    # Less than the command's timeout_s: the caller did not wait on the command.
    assert time.monotonic() - started < 0.5
    notifier.close()
    assert time.monotonic() - started < 15  # killed at its timeout, not its 30 s
    assert [(e.notify, e.kind) for e in recorded] == [("failed", "notify_failed")]
    assert "timeout_s (0.5 s): killed" in recorded[0].reason


def test_only_chosen_events_notify_and_a_pile_up_is_dropped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(notify, "QUEUE_MAX", 3)
    out = tmp_path / "out.txt"
    notifier, recorded = _notifier(tmp_path, f"sleep 0.2; echo $MGPU_EVENT >> {out}",
                                   events=["straggler", "stopped"])
    notifier.tell(ev.Restart(generation=1))
    for _ in range(10):
        notifier.tell(eventlines.from_record({"event": "straggler", "task": "worker1", "host": "h1",
                                      "slowdown": 2.0, "evidence": {}}))
    notifier.close()
    runs = out.read_text().split()
    # At the end the one running and the newest queued run; the rest are said not run.
    assert set(runs) == {"straggler"} and 1 <= len(runs) <= 2
    *skipped, dropped = recorded
    assert all(e.reason.startswith("not run: the job ended") for e in skipped)
    assert len(runs) + len(skipped) == 10 - notifier.dropped and notifier.dropped >= 6
    assert f"{notifier.dropped} notification(s) not run: more than 3" in dropped.reason
    assert dropped.notify == "straggler"


def test_a_job_the_launcher_could_not_go_on_with_still_notifies_failed(tmp_path: Path):
    """The supervisor raised (hosts lost past planning, or a fault of its own):
    the job still ends with `job_done`, and `failed` is notified."""
    from types import SimpleNamespace as Stub

    from launcher.job.run.launch import Job
    from launcher.spec.rundir import RunRecorder

    class Raising:
        links: dict = {}

        def run(self):
            raise RuntimeError("boom")

    out = tmp_path / "out.jsonl"
    notifier = notify.Notifier(NotifySettings(command=f"cat >> {out}"), "demo", tmp_path)
    screen = Stub(notice=lambda text: None, tell=lambda event: None, close=lambda: None,
                  terminal_lost=None, terminal_lost_t=None, dropped=0)
    connected = Stub(transport=Stub(close=lambda: None), plan=Stub(grace_s=3.0),
                     events=Stub(close=lambda: None, dropped={}, cut={},
                                 drop_report=lambda: ""))
    launch = Stub(loaded=Stub(config=Stub(transport="local")))
    outcome = Job(launch, connected, Raising(), RunRecorder(tmp_path / "run"), screen,
                  [notifier]).run()
    assert outcome.result.status == "failed"
    [line] = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["notify"] == "failed" and "RuntimeError: boom" in line["message"]
    assert read_events(tmp_path / "run")[-1]["event"] == "job_done"


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_notification_running_at_the_end_never_outlives_the_launcher(tmp_path, monkeypatch):
    """Issue 38: a `restarted` command still running when the job fails: it
    keeps its timeout_s, the `failed` one then gets its own, a stale one
    queued between them is not run, and nothing is left running after close."""
    monkeypatch.setattr(notify, "CLOSE_SLACK_S", 0.5)
    log = tmp_path / "nlog"
    command = f'echo "$MGPU_EVENT $$ start" >> {log}; sleep 15; echo "$MGPU_EVENT end" >> {log}'
    notifier, recorded = _notifier(tmp_path, command, timeout_s=2.0,
                                   events=["restarted", "failed"])
    notifier.tell(ev.Restart(generation=1))
    wait_for(lambda: log.exists() and "restarted" in log.read_text(), 10, "restarted to start")
    notifier.tell(ev.Restart(generation=2))
    notifier.tell(ev.JobDone(status="failed"))
    started = time.monotonic()
    notifier.close()
    # Bounded (2 x (timeout_s + slack) = 5 s, then killed), never the commands'
    # 15 s sleeps; the margin is for a loaded machine, not a speed target.
    assert time.monotonic() - started < 15
    runs = [line.split() for line in log.read_text().splitlines()]
    assert [(r[0], r[2]) for r in runs] == [("restarted", "start"), ("failed", "start")]
    for _, pgid, _ in runs:
        wait_for(lambda pgid=pgid: _group_gone(int(pgid)), 10, f"command group {pgid} gone")
    said = [(e.notify, e.reason) for e in recorded]
    assert [name for name, _ in said] == ["restarted", "restarted", "failed"], said
    assert "timeout_s (2 s): killed" in said[0][1] and "timeout_s (2 s): killed" in said[2][1]
    assert said[1][1].startswith("not run: the job ended while it waited")
    assert "end" not in log.read_text()
