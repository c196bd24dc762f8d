"""The README's own example through one kill (issue 53): the terminal's end
lines, `status` (text and `--json`), the report and summary.json say the same
step — the job's, 8 epochs of 22 = 176, not the count since the last restart —
and the same resume point, and no false "resumed behind the last save"."""

from __future__ import annotations

import html
import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import (
    EXAMPLES,
    read_events,
    read_summary,
    run_cli,
    start_cli,
    task_pids,
    wait_for,
)

pytestmark = pytest.mark.e2e

LAST = 8 * 22  # --epochs 8 of 22 steps (1437 samples, a global batch of 64)


def saved_at_least(run_dir: Path, step: int) -> bool:
    return any(e["event"] == "progress" and (e.get("saved") or 0) >= step
               for e in read_events(run_dir))


def test_after_a_kill_every_view_says_the_jobs_step_and_where_it_resumed(workdir: Path):
    run_dir = workdir / "run"
    proc = start_cli(["--local", "2", "--no-live", "--run-dir", str(run_dir),
                      str(EXAMPLES / "digits" / "train.py"), "--epochs", "8"], cwd=workdir)
    try:
        wait_for(lambda: saved_at_least(run_dir, 44), timeout=240, what="a save at step 44")
        os.kill(task_pids(run_dir)["worker1"], signal.SIGKILL)
        code = proc.wait(timeout=300)
        output = proc.stdout.read()
    finally:
        proc.kill()
    assert code == 0, output[-3000:]
    summary = read_summary(run_dir)
    [entry] = summary["resumed"]
    resumed = entry["step"]
    assert resumed >= 44 and resumed % 22 == 0, entry
    for task in ("host0/worker0", "host1/worker1"):
        assert re.search(rf"{task}\s+succeeded\s+step {LAST}\b", output), output[-2000:]
    assert "behind the last save" not in output, output[-3000:]

    status = run_cli(["status", str(run_dir)], cwd=workdir, timeout=60).stdout
    rows = [line.split() for line in status.splitlines() if line.startswith("host")]
    assert len(rows) == 2 and all(str(LAST) in row for row in rows), status
    assert f"generation 1 resumed at epoch {resumed // 22} (step {resumed})" in status, status
    assert "behind the last save" not in status, status

    view = json.loads(run_cli(["status", "--json", str(run_dir)], cwd=workdir,
                              timeout=60).stdout)
    assert [t["last_step"] for t in view["tasks"]] == [LAST, LAST], view["tasks"]
    assert [r["step"] for r in view["resumed"]] == [resumed], view["resumed"]

    page = workdir / "report.html"
    run_cli(["report", str(run_dir), "-o", str(page)], cwd=workdir, timeout=60)
    text = html.unescape(page.read_text())
    assert f"generation 1 resumed at epoch {resumed // 22} (step {resumed})" in text
