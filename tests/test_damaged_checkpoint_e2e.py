"""A damaged checkpoint is passed over, not blamed on the script (issue 51 item 2).

TF's custom-loop tutorial shape (its own `tf.train.CheckpointManager`,
`max_to_keep=3`, `checkpoint.restore(manager.latest_checkpoint)`) under the
real CLI with two local workers. The faults are real: kill -9 of worker 1
after the chief's saves, then, while the job is between generations, the
newest checkpoint's data file cut to half (a torn write on a shared
filesystem) or worse. Without the runtime's check (launcher/runtime/readable.py)
the restart fails with `IndexError: Read less bytes than requested` twice and
the launcher gives up on the script.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from launcher.outlets.rundir import load_run
from launcher.views.records import render_status
from tests.conftest import SCRIPTS, read_summary, wait_for
from tests.test_faults import Job, jobs, launch, write_yaml  # noqa: F401 - `jobs` is a fixture

pytestmark = pytest.mark.e2e

LOOP = str(SCRIPTS / "tutorial_ctl_latest.py")
DATA = ".data-00000-of-00001"


def start(workdir: Path, jobs: list[Job]) -> tuple[Job, Path]:  # noqa: F811
    # backoff_s: the test damages the checkpoint between the generations (at
    # once after the teardown; generation 1 reads it only after importing TF).
    config = write_yaml(workdir / "cluster.yaml", """\
name: torn
transport: local
ports: {base: auto}
hosts:
  - {address: 127.0.0.1, name: host0}
  - {address: 127.0.0.1, name: host1}
restart: {max_restarts: 1, backoff_s: 1}
""")
    directory = workdir / "ckpt"
    return launch(jobs, [str(config), "--no-live", LOOP, str(directory)], workdir), directory


def kill_worker1_after_saves(job: Job, saves: int) -> None:
    """kill -9 worker 1 once the chief reported `saves` saves; wait for the teardown."""
    wait_for(lambda: [e for e in job.events("progress", generation=0, task="worker0")
                      if e.get("saved", 0) >= 20 * saves], timeout=180, what=f"{saves} saves")
    os.kill(job.pids()[(0, "worker1")], signal.SIGKILL)
    job.wait_event("teardown_done", timeout=60, generation=0)


def newest(directory: Path) -> str:
    text = (directory / "checkpoint").read_text()
    return re.search(r'^model_checkpoint_path: "([^"]+)"', text, re.M).group(1)


def tear(path: Path) -> int:
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return path.stat().st_size


def restored(output: str) -> dict[str, int]:
    """Each task's RESTORED line of generation 1 (the last of each)."""
    return {task: int(step) for task, step in
            re.findall(r"^\S*?(worker\d) +\| RESTORED (\d+)", output, re.M)}


def test_a_torn_newest_checkpoint_is_passed_over_for_the_one_before(workdir: Path, jobs):  # noqa: F811
    job, directory = start(workdir, jobs)
    kill_worker1_after_saves(job, 2)
    name = newest(directory)  # ckpt-2 or later: the chief may have saved once more
    number = int(name.rsplit("-", 1)[1])
    size = tear(directory / f"{name}{DATA}")
    assert job.finish(timeout=240) == 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 1, summary
    [passed] = job.events("checkpoint_passed_over")
    assert passed["generation"] == 1 and passed["checkpoint"] == str(directory / name), passed
    assert "shorter than its index" in passed["why"], passed
    assert passed["restored"] == str(directory / f"ckpt-{number - 1}"), passed
    # Every worker restored the one before, and the job resumed there.
    assert restored(job.output) == {"worker0": 20 * (number - 1),
                                    "worker1": 20 * (number - 1)}, job.output[-4000:]
    assert [e["step"] for e in job.events("resumed")] == [20 * (number - 1)]
    assert not job.events("resume_behind")  # behind the damaged save by design, not a warning
    # The damaged files are kept, as they were, beside.
    kept = Path(passed["kept_in"])
    assert kept.parent == directory / "damaged", kept
    assert (kept / f"{name}{DATA}").stat().st_size == size
    assert (kept / f"{name}.index").exists()
    # Said: in the terminal and by `status`.
    said = [line for line in job.output.splitlines() if "passed over checkpoint" in line]
    assert len(said) == 1 and str(kept) in said[0] and "torn" in said[0], job.output[-4000:]
    assert "passed over checkpoint" in render_status(load_run(job.run_dir))


def test_with_no_readable_checkpoint_left_the_job_stops_saying_so(workdir: Path, jobs):  # noqa: F811
    job, directory = start(workdir, jobs)
    kill_worker1_after_saves(job, 2)
    names = re.findall(r'^all_model_checkpoint_paths: "([^"]+)"',
                       (directory / "checkpoint").read_text(), re.M)
    for name in names:
        tear(directory / f"{name}{DATA}")
    before = sorted(os.listdir(directory))
    assert job.finish(timeout=240) != 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["restarts"] == 1 and summary["stopped_by"] == "deterministic", summary
    assert "no readable checkpoint is left" in summary["message"], summary
    assert "a mistake in the script" not in summary["message"], summary
    assert all(name in summary["message"] for name in names), summary
    assert sorted(os.listdir(directory)) == before  # nothing moved, nothing deleted
    assert not job.events("checkpoint_passed_over")


def test_every_task_is_told_the_directories_the_job_saved_to(tmp_path: Path):
    """Where a damaged checkpoint may be mended (runtime/jobdirs.py): the first
    generation is told none (set, empty: a warm start's directory is only
    read), each later one every directory a task reported a save into."""
    from tests.fake_agents import harness

    def script(generation: int, name: str):
        if generation:
            return [(1.0, "exit", {"code": 0})]
        return [(0.5, "progress", {"data": {"step": 10, "saved": 10,
                                            "saved_dir": f"/ckpt/{name}", "checkpoint": 1}}),
                (1.0, "exit", {"code": 1})]

    h = harness(tmp_path, script, max_restarts=2)
    assert h.supervisor.run().status == "succeeded"
    told = {m["generation"]: m["env"].get("MGPU_SAVE_DIRS") for m in h.links["host1"].sent
            if m["op"] == "start"}
    assert told[0] == "" and set(told[1].split(os.pathsep)) == {"/ckpt/worker0",
                                                                "/ckpt/worker1"}, told
