"""`status` and `logs` read a run directory written before the typed events
(schema version 1: no `v` on its lines): tests/data/run_v1 was written by
`mgpu-launch --local 2 --max-restarts 1 fail_on_worker1.py` on the main of
2026-11-26, and the expected texts beside it were printed by that main's code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.outlets import rundir
from launcher.views import records

DATA = Path(__file__).parent / "data"
RUN = DATA / "run_v1"
REPO = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1"})


def test_status_of_an_old_run_dir_prints_what_it_printed():
    result = cli("status", "tests/data/run_v1")
    assert result.returncode == 0, result.stderr
    assert result.stdout == (DATA / "run_v1.status.txt").read_text()


def test_status_json_of_an_old_run_dir_is_unchanged():
    result = cli("status", "--json", "tests/data/run_v1")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads((DATA / "run_v1.status.json").read_text())


def test_logs_of_an_old_run_dir_print_what_they_printed():
    every = cli("logs", "tests/data/run_v1")
    one = cli("logs", "tests/data/run_v1", "worker1", "-n", "3")
    assert every.stdout == (DATA / "run_v1.logs.txt").read_text()
    assert one.stdout == (DATA / "run_v1.logs_worker1.txt").read_text()


def test_an_old_run_without_summary_is_replayed_as_before(tmp_path: Path, monkeypatch):
    shutil.copytree(RUN, tmp_path / "RUN")
    (tmp_path / "RUN" / "summary.json").unlink()
    monkeypatch.chdir(tmp_path)
    view = rundir.load_run("RUN", alive=lambda launch: False)
    assert records.render_status(view, now=0) + "\n" == \
        (DATA / "run_v1.status_no_summary.txt").read_text()


def test_every_moment_of_an_old_run_is_replayed_as_before(tmp_path: Path):
    """Each prefix of events.jsonl (the run as `status` saw it while it went)."""
    lines = (RUN / "events.jsonl").read_text().splitlines()
    expected = json.loads((DATA / "run_v1.replay.json").read_text())
    assert len(expected) == len(lines)
    for moment in expected:
        run = tmp_path / f"run{moment['events']}"
        run.mkdir()
        (run / "events.jsonl").write_text("\n".join(lines[:moment["events"]]) + "\n")
        view = rundir.load_run(run, alive=lambda launch: False)
        seen = [[t.label, t.state, t.exit_code, t.signal, t.pid] for t in view.tasks]
        assert (view.generation, view.restarts, seen,
                [f["description"] for f in view.failures]) == \
            (moment["generation"], moment["restarts"], moment["tasks"], moment["failures"]), \
            f"after {moment['events']} events"
