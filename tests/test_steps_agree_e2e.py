"""Script shapes through one kill (issue 53 item 4): the README's own example
(runtime.callbacks(), tf_keras), a zero-code Keras 3 `fit` with its own
BackupAndRestore, a custom loop with its own CheckpointManager, and Keras 3 on JAX
as its distribution guide teaches (`strategy: keras_distribution`, its own
BackupAndRestore, no runtime call). After the job succeeded, the terminal's end
lines, `status` (text and `--json`), the report, summary.json, the metrics and the
live table say the same step — the job's, not the count since the last restart —
and the same resume point (and the metrics the newest save), and no false "resumed
behind the last save". The report has no "generation -1" row."""

from __future__ import annotations

import html
import json
import os
import re
import signal
from pathlib import Path

import pytest

from launcher.job.record import eventlines
from launcher.job.record.story import fold
from launcher.views import live
from launcher.views.metrics import JobMetrics
from tests.conftest import (
    EXAMPLES,
    SCRIPTS,
    read_events,
    read_summary,
    run_cli,
    start_cli,
    task_pids,
    wait_for,
)
from tests.test_metrics import samples

pytestmark = pytest.mark.e2e

JAX_CLUSTER = ("strategy: keras_distribution\nkeras: jax\ntransport: local\nports: {base: auto}\n"
               "hosts:\n  - {address: 127.0.0.1, name: host0}\n"
               "  - {address: 127.0.0.1, name: host1}\n"
               # process 1 kills itself (SIGKILL) right after step 50, past the backup
               # of step 40: its 40 steps of 0.02 s left leave no time to kill it from here
               "env: {KILL_AT_STEP: '50'}\n")


def on_jax(w: Path) -> list[str]:
    (w / "cluster.yaml").write_text(JAX_CLUSTER)
    return [str(w / "cluster.yaml"), str(SCRIPTS / "tutorial_keras_jax_backup.py"),
            str(w / "backup")]


# (the launcher's arguments given the work folder, the step of the save to kill
# after, the job's last step)
SHAPES = {
    # --epochs 8 of 22 steps (1437 samples, a global batch of 64)
    "bundled_example": (lambda w: ["--local", "2", str(EXAMPLES / "digits" / "train.py"),
                                   "--epochs", "8"], 44, 8 * 22),
    # 6 epochs of 40 steps, its own backup directory, tf.keras as Keras 3
    "zero_code_fit": (lambda w: ["--local", "2", str(SCRIPTS / "tutorial_backup.py"),
                                 str(w / "backup")], 80, 6 * 40),
    # 6 epochs of 20 steps, its own CheckpointManager (model and optimizer)
    "custom_loop": (lambda w: ["--local", "2", str(SCRIPTS / "tutorial_ctl_checkpoint.py"),
                               str(w / "ckpt")], 40, 6 * 20),
    # 4 epochs of 20 steps, killed by its own cluster file's KILL_AT_STEP
    "keras3_on_jax": (on_jax, 40, 4 * 20),
}
KILLS_ITSELF = {"keras3_on_jax"}


def saved_at_least(run_dir: Path, step: int) -> bool:
    return any(e["event"] == "progress" and (e.get("saved") or 0) >= step
               for e in read_events(run_dir))


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_after_a_kill_every_view_says_the_jobs_step_and_where_it_resumed(workdir: Path,
                                                                        shape: str):
    argv, kill_after, last = SHAPES[shape]
    run_dir = workdir / "run"
    proc = start_cli(["--no-live", "--run-dir", str(run_dir), *argv(workdir)], cwd=workdir)
    try:
        if shape not in KILLS_ITSELF:
            wait_for(lambda: saved_at_least(run_dir, kill_after), timeout=240,
                     what=f"a save at step {kill_after}")
            os.kill(task_pids(run_dir)["worker1"], signal.SIGKILL)
        code = proc.wait(timeout=300)
        output = proc.stdout.read()
    finally:
        proc.kill()
    assert code == 0, output[-3000:]
    summary = read_summary(run_dir)
    [entry] = summary["resumed"]
    resumed = entry["step"]
    assert kill_after <= resumed < last, entry
    for task in ("host0/worker0", "host1/worker1"):
        assert re.search(rf"{task}\s+succeeded\s+step {last}\b", output), output[-2000:]
    assert "behind the last save" not in output, output[-3000:]
    said = re.search(r"generation 1 resumed at [^\n]*", output)
    assert said is not None and f"step {resumed}" in said.group(0), output[-3000:]

    status = run_cli(["status", str(run_dir)], cwd=workdir, timeout=60).stdout
    rows = [line.split() for line in status.splitlines() if line.startswith("host")]
    assert len(rows) == 2 and all(str(last) in row for row in rows), status
    assert said.group(0) in status and "behind the last save" not in status, status

    view = json.loads(run_cli(["status", "--json", str(run_dir)], cwd=workdir,
                              timeout=60).stdout)
    assert [t["last_step"] for t in view["tasks"]] == [last, last], view["tasks"]
    assert [r["step"] for r in view["resumed"]] == [resumed], view["resumed"]
    assert [t["last_progress"].get("job_step") for t in summary["tasks"].values()] \
        == [last, last], summary["tasks"]
    # The goodput ledger's steps: the same step reached and resume point.
    steps = summary["goodput"]["steps"]
    assert steps["reached"] == last, steps
    assert [g["resumed_at"] for g in steps["generations"]] == [0, resumed], steps

    page = workdir / "report.html"
    run_cli(["report", str(run_dir), "-o", str(page)], cwd=workdir, timeout=60)
    report = html.unescape(page.read_text())
    assert said.group(0) in report and "generation -1" not in report, report[-3000:]

    # The metrics and the live table (the launcher's, `status --watch`'s), told the events.
    records = read_events(run_dir)
    metrics = JobMetrics("agree")
    for record in records:
        metrics.tell(eventlines.from_record(record))
    got = samples(metrics.text())
    assert got[("mgpu_resumed_step", (("job", "agree"),))] == resumed, got
    newest = max(e["saved"] for e in records if e["event"] == "progress" and e.get("saved"))
    assert got[("mgpu_last_saved_step", (("job", "agree"),))] == newest >= resumed, got
    assert sorted(v for (name, _), v in got.items() if name == "mgpu_task_step") == [last] * 2
    table = live.render(fold(records).rows(records[-1]["t"]), width=200, height=20,
                        elapsed_s=0.0, colour=False)
    cells = [line.split() for line in table if line.startswith("host")]
    assert [row[3] for row in cells] == [str(last)] * 2, table
