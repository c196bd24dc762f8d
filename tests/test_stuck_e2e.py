"""Every task alive, nothing moving: real two-worker TensorFlow jobs whose
scripts carry one out-of-step bug each (tests/scripts/stuck_*.py, unmodified
otherwise, knowing nothing of mgpu-launch). The root cause names the task and
the cause in the script's terms, well within `hang_timeout_s` (30 s here),
in the terminal, `status`, the report and summary.json; a stuck job's stacks
are kept."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from tests.conftest import SCRIPTS, read_events, read_summary, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.stuck_expected]

CLUSTER = """\
name: stuck
transport: local
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: h0}
  - {address: 127.0.0.1, name: h1}
restart: {hang_timeout_s: 30, max_restarts: 0}
"""


def run_stuck(workdir: Path, script: str) -> tuple[str, dict, list[dict], Path]:
    config = workdir / "cluster.yaml"
    config.write_text(CLUSTER)
    run_dir = workdir / "run"
    result = run_cli(["--run-dir", str(run_dir), "--no-live", str(config),
                      str(SCRIPTS / script)], cwd=workdir, timeout=180)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr, read_summary(run_dir), read_events(run_dir), run_dir


def named_in_every_view(output: str, summary: dict, run_dir: Path, workdir: Path,
                        task: str, words: str) -> None:
    cause = summary["root_cause"]
    assert cause["task"] == task and cause["kind"] == "out_of_step", cause
    assert words in cause["description"], cause["description"]
    assert f"root cause: {task} " in output and words in output, output[-3000:]
    status = run_cli(["status", str(run_dir)], cwd=workdir, timeout=60)
    assert words in status.stdout, status.stdout
    page = workdir / "report.html"
    run_cli(["report", str(run_dir), "-o", str(page)], cwd=workdir, timeout=60)
    assert words in html.unescape(page.read_text()), "the report names the cause"


def test_uneven_input_is_named_when_the_collectives_abort(workdir: Path):
    output, summary, events, run_dir = run_stuck(workdir, "stuck_uneven.py")
    named_in_every_view(output, summary, run_dir, workdir, "h1/worker1",
                        "has 37 batches an epoch and worker0 40")
    assert "repeat() the dataset and set steps_per_epoch" in summary["root_cause"]["description"]
    # Foreseen at the first steps (a warning), then TF's abort was seen and
    # the cause replaced it.
    said = [e.get("kind", e["event"]) for e in events
            if e["event"] in ("out_of_step_ahead", "failure_detected", "root_cause")]
    assert said[:2] == ["out_of_step_ahead", "collective_abort"], said
    assert said[-1] == "out_of_step", said
    assert "warning: h1/worker1 has 37 batches an epoch and worker0 40" in output


def test_chief_only_evaluate_is_named_long_before_the_hang_timeout(workdir: Path):
    output, summary, events, run_dir = run_stuck(workdir, "stuck_chief_eval.py")
    named_in_every_view(output, summary, run_dir, workdir, "h0/worker0",
                        "entered evaluate() at step 40, worker1 had finished")
    assert "call evaluate() on every worker" in summary["root_cause"]["description"]
    done = next(e["t"] for e in events if e["event"] == "task_exited" and e["task"] == "worker1")
    detected = next(e for e in events if e["event"] == "failure_detected")
    assert detected["kind"] == "out_of_step" and detected["t"] - done < 25.0, detected
    # A stuck job's stacks, as for a hang (worker0 waits inside evaluate(), or
    # at its exit for TF's collective threads once evaluate() failed).
    stacks = [e for e in events if e["event"] == "stacks" and e["task"] == "worker0"]
    assert stacks and stacks[0]["taken"], stacks
    assert "h0/worker0, generation 0" in (run_dir / "stacks" / "worker0.txt").read_text()


def test_steps_per_epoch_from_each_workers_shard_is_named(workdir: Path):
    output, summary, _, run_dir = run_stuck(workdir, "stuck_steps.py")
    named_in_every_view(output, summary, run_dir, workdir, "h1/worker1",
                        "runs 37 steps an epoch and worker0 40")


def test_a_custom_loops_call_on_the_chief_only_is_named(workdir: Path):
    output, summary, _, run_dir = run_stuck(workdir, "stuck_ctl_eval.py")
    named_in_every_view(output, summary, run_dir, workdir, "h0/worker0",
                        "is in strategy.reduce() (its distributed call 13, 1st of its kind), "
                        "worker1 in train_step (its call 11)")


def test_chief_only_evaluate_after_a_fit_that_deletes_its_backup_stops_soon(workdir: Path):
    """TF's MWMS fit tutorial with its own BackupAndRestore, then evaluate() on
    the chief only (issue 53 item 2): fit() deletes its backup when it ends, so
    every restart trains from 0 and saves again up to the same step. That is no
    progress: the job stops after at most 2 restarts, naming evaluate() on the
    chief, with no false "resumed behind the last save" warning."""
    config = workdir / "cluster.yaml"
    config.write_text(CLUSTER.replace("max_restarts: 0", "max_restarts: 3, backoff_s: 0"))
    run_dir = workdir / "run"
    result = run_cli(["--run-dir", str(run_dir), "--no-live", str(config),
                      str(SCRIPTS / "chief_eval_backup.py"), str(workdir / "backup")],
                     cwd=workdir, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    summary = read_summary(run_dir)
    assert summary["restarts"] <= 2, output[-3000:]
    assert summary["stopped_by"] == "deterministic", summary
    cause = summary["root_cause"]
    assert cause["task"] == "h0/worker0" and "evaluate()" in cause["description"], cause
    assert "behind the last save" not in output, output[-3000:]
