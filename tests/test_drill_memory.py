"""`mgpu-launch drill --memory`: the memory tier's cost measured (a save's stall
to host memory against the agent's copy of it to the directory) and the
`checkpoint.memory_interval` it advises; for real on TensorFlow's tutorial,
and the advice's arithmetic."""

from __future__ import annotations

import pytest

from launcher.commands.drill_memory import MemoryCosts
from launcher.job.record import events as ev
from launcher.views.drill_report import (
    Observed,
    goodput,
    judge,
    memory_advice,
    render,
    report,
    young_daly,
)
from tests.conftest import SCRIPTS
from tests.test_drill import run_drill


def progress(**metrics) -> ev.Progress:
    return ev.Progress(generation=0, task="worker0", host="host0", metrics=metrics)


def test_the_copies_are_heard_and_the_advice_is_young_daly_on_the_stall_to_memory():
    costs = MemoryCosts()
    assert costs.figures() is None  # the tier off: no copy told
    for seconds in (5.0, 6.0, 4.0):
        costs.tell(progress(memory_copy_s=seconds, memory_copy_bytes=100_000_000))
    costs.tell(progress(step=10, save_s=0.1))  # a save report is not a copy
    assert costs.figures() == {"directory_s": 5.0, "copies": 3.0, "copy_mb": 100.0}

    mtbf_s = 3600.0
    advice = memory_advice(costs.figures(), 0.05, 20.0, mtbf_s, 10.0)
    tau = young_daly(0.05, mtbf_s)  # 19 s
    assert advice["recommended_interval_s"] == round(tau, 1)
    assert advice["recommended_memory_interval_steps"] == round(tau * 20)
    assert advice["goodput_at_recommended"] == goodput(tau, 0.05, mtbf_s, 10.0)
    assert advice["directory_stall_s"] == 5.05  # the stall, then the bytes to the directory
    assert advice["goodput_at_recommended"] > advice["goodput_saving_to_directory"]
    said = render(report([judge(Observed("kill"))], [], hosts=1, mtbf_hours=1.0,
                         timed=[0.05], copies=costs.figures()))
    assert "memory tier: a save blocks training 0.05 s in memory; the agent wrote it to the " \
        "directory in 5 s (100 MB, in the background)" in said
    assert f"recommended memory_interval: {round(tau, 1):g} s of training" in said  # no rate
    assert "shorter than a copy" not in said and "spares little" not in said  # 19 s > 5 s
    fast = memory_advice({"directory_s": 0.01}, 0.2, 10.0, mtbf_s, 10.0)
    assert "the directory is fast here" in render(report(
        [judge(Observed("kill"))], [], hosts=1, mtbf_hours=1.0, timed=[0.2],
        copies={"directory_s": 0.01})) and fast["directory_stall_s"] == 0.21
    off = render(report([judge(Observed("kill"))], [], hosts=1, mtbf_hours=1.0, timed=[1.0]))
    assert "memory tier: off (drill --memory measures" in off


@pytest.mark.e2e
def test_a_drill_with_the_memory_tier_measures_both_costs(workdir):
    code, data, output = run_drill(workdir, [
        "--local", "2", "--faults", "kill", "--memory",
        str(SCRIPTS / "tutorial_backup.py"), str(workdir / "backup")], timeout=240)
    assert code == 0, output[-3000:]
    [fault] = data["faults"]
    assert fault["verdict"] == "pass", fault
    memory = data["memory"]
    assert memory["directory_s"] >= 0 and memory["save_stall_s"] is not None, memory
    assert memory["copy_mb"] is not None and memory["recommended_memory_interval_steps"], memory
    assert "recommended memory_interval:" in output, output[-3000:]
