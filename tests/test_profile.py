"""`mgpu-launch profile RUN_DIR`: one synchronized trace of a running job.

A real `--local 2` job (TensorFlow's Keras tutorial, unmodified, training
until released) is traced for a second; both tasks' xplane files land in
TensorBoard's layout and a per-task table is printed. Its workers train each
by itself: TF 2.21's profiler crashes a MultiWorkerMirroredStrategy task at
`stop()` now and then (docs/profiles.md; the collectives' figures are checked
on recorded traces in test_profile_unit.py). A job that is not running is
refused with exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

from launcher.commands import profile
from tests.conftest import reported_steps, run_cli, start_cli, wait_for

SCRIPT = Path(__file__).parent / "scripts" / "train_until_released.py"


def test_profile_traces_every_task_of_a_running_job_at_once(workdir: Path):
    run_dir, release = workdir / "run", workdir / "release"
    job = start_cli(["--local", "2", "--run-dir", str(run_dir), str(SCRIPT), str(release),
                     "alone"],
                    cwd=workdir, MGPU_STEPS_EVERY_S="0.5")
    try:
        wait_for(lambda: set(reported_steps(run_dir)) == {"worker0", "worker1"}, 90,
                 "both workers training")
        # A MultiWorkerMirroredStrategy job (the default) is traced only when asked twice.
        refused = run_cli(["profile", str(run_dir), "--seconds", "1"], cwd=workdir, timeout=90)
        asked = list((run_dir / "profiles").iterdir()) if (run_dir / "profiles").exists() else []
        result = run_cli(["profile", str(run_dir), "--seconds", "1", "--allow-restart"],
                         cwd=workdir, timeout=90)
    finally:
        job.terminate()  # the launcher stops the tasks (SIGTERM): sooner than TF's own exit
        try:
            job.wait(timeout=60)
        finally:
            release.touch()
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--allow-restart" in refused.stderr and "crash" in refused.stderr, refused.stderr
    assert asked == [], asked  # refused before asking the launcher anything
    assert result.returncode == 0, result.stdout + result.stderr
    said = result.stdout + result.stderr
    (capture,) = (p for p in (run_dir / "profiles").iterdir() if p.is_dir())
    traces = sorted(p.name for p in capture.glob("plugins/profile/*/*.xplane.pb"))
    assert traces == ["worker0.xplane.pb", "worker1.xplane.pb"], said
    lines = result.stdout.splitlines()
    header = next(line for line in lines if line.startswith("task"))
    assert header.split() == ["task", "host", "steps", "step", "collectives", "input",
                              "compute"]
    rows = {line.split()[0]: line for line in lines if line.startswith("worker")}
    assert set(rows) == {"worker0", "worker1"}, said
    assert all(row.count(" ms") == 4 for row in rows.values()), rows
    assert str(capture) in result.stdout  # where the traces are
    summary = json.loads((capture / "summary.json").read_text())
    for task in ("worker0", "worker1"):
        figures = summary["tasks"][task]["summary"]
        assert figures["steps"] > 0 and figures["compute_s"] > 0, figures
        assert 0.8 < figures["window_s"] < 3, figures
    assert summary["missing"] == {}, said

    # The job is over now: nothing to trace.
    assert profile.main(["profile", str(run_dir)]) == 2


def test_profile_refuses_what_is_not_a_running_job(workdir: Path, capsys):
    assert profile.main(["profile", str(workdir / "nowhere")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert profile.main(["profile", str(workdir)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    (workdir / "summary.json").write_text('{"status": "succeeded"}')
    assert profile.main(["profile", str(workdir)]) == 2
    assert "the job has finished" in capsys.readouterr().err
