"""TF1 graph-mode sessions with no MonitoredSession, in a real task process as
the agent starts it (launcher/runtime/sessions.py, saves.py, restores.py): a
plain `Session.run(train_op)` loop's global step counted, its `Saver`'s saves
and restores reported; with no global step, its resume point said as unknown."""

from __future__ import annotations

from pathlib import Path

from launcher.runtime.restores import NO_GLOBAL_STEP
from tests.test_runtime_restores import run_script


def test_a_plain_session_run_loop_reports_its_global_step_and_saves(tmp_path: Path):
    ckpt = str(tmp_path / "ckpt")
    first, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "40"], 0,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 40" in output, output[-3000:]
    assert [(r["saved"], r["saved_dir"]) for r in first if "saved" in r] == [
        (10, ckpt), (20, ckpt), (30, ckpt), (40, ckpt)], first
    counted = [r["step"] for r in first if r.get("counted")]
    assert counted == sorted(counted) and counted[-1] == 40, first  # the last, as it closed
    assert [step for step in counted if step % 10], counted  # between saves, not at them only


def test_a_restore_with_no_global_step_nor_step_in_its_name_is_said_unknown(tmp_path: Path):
    ckpt = str(tmp_path / "ckpt")
    first, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "20", "nostep"], 0,
                               MGPU_STEPS_EVERY_S="0.05")
    assert "TRAINED 20" in output, output[-3000:]
    assert not [r for r in first if r.get("counted")], first  # no global step: no step guessed
    again, output = run_script(tmp_path, ["tf1_plain_loop.py", ckpt, "10", "nostep"], 1)
    [unknown] = [r for r in again if "resumed_unknown" in r]
    assert (unknown["resumed_unknown"], unknown["resumed_dir"]) == (NO_GLOBAL_STEP, ckpt)
    assert not [r for r in again if "resumed" in r], again  # never a guessed step
