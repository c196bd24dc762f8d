"""Nothing a task started outlives it: a child that left the task's session
(`setsid`), ignores SIGTERM and dropped its environment is reaped when the
task ends by itself, fails, or the launcher is interrupted.

Real processes: tests/scripts/setsid_child.py through the real launcher, and
launcher.proctree's two ways (cgroup, tracked /proc tree) on their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.proctree import TaskTree, Tracker, cgroup_home
from tests.conftest import SCRIPTS, alive, run_cli, start_cli, wait_for

SCRIPT = SCRIPTS / "setsid_child.py"


def written_pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def kill_all(pids: list[int]) -> None:
    for pid in alive(pids):
        os.kill(pid, signal.SIGKILL)


def cluster(path: Path) -> Path:
    path.write_text("name: orphans\ntransport: local\nports: {base: auto}\n"
                    "hosts:\n  - {address: 127.0.0.1, name: host0}\n"
                    "restart: {max_restarts: 0, backoff_s: 0}\n")
    return path


@pytest.mark.e2e
@pytest.mark.parametrize(("mode", "code"), [("ok", 0), ("fail", 1)])
def test_a_setsid_child_that_ignores_sigterm_dies_with_its_task(workdir: Path, mode: str,
                                                                  code: int):
    pid_file = workdir / "orphans.txt"
    try:
        done = run_cli(["--run-dir", str(workdir / "run"), str(cluster(workdir / "c.yaml")),
                        str(SCRIPT), str(pid_file), mode], cwd=workdir, timeout=120)
        assert done.returncode == code, done.stdout[-3000:] + done.stderr[-3000:]
        pids = written_pids(pid_file)
        assert len(pids) == 1
        wait_for(lambda: alive(pids) == [], timeout=30,
                 what=f"the task's setsid child to be gone (left: {alive(pids)})")
    finally:
        kill_all(written_pids(pid_file))


@pytest.mark.e2e
def test_ctrl_c_leaves_no_setsid_child(workdir: Path):
    pid_file = workdir / "orphans.txt"
    proc = start_cli(["--local", "1", "--run-dir", str(workdir / "run"),
                      str(SCRIPT), str(pid_file), "wait"], cwd=workdir)
    try:
        wait_for(lambda: written_pids(pid_file), timeout=60, what="the setsid child to start")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        pids = written_pids(pid_file)
        wait_for(lambda: alive(pids) == [], timeout=30,
                 what=f"the task's setsid child to be gone (left: {alive(pids)})")
    finally:
        proc.kill()
        kill_all(written_pids(pid_file))


def modes() -> list[str]:
    return ["tracked", "cgroup"] if cgroup_home() else ["tracked"]


@pytest.mark.parametrize("mode", modes())
def test_a_tree_reaps_an_orphan_after_its_root_exited(tmp_path: Path, mode: str):
    pid_file = tmp_path / "orphans.txt"
    token = os.urandom(8).hex()
    tree = TaskTree(f"MGPU_TASK_TOKEN={token}".encode(),
                    cgroup_home() if mode == "cgroup" else None)
    assert tree.mode == mode
    tracker = Tracker(every_s=0.05)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(pid_file), "ok"],
                            env={**os.environ, "MGPU_TASK_TOKEN": token},
                            stdout=subprocess.DEVNULL, preexec_fn=tree.preexec(os.setsid))
    try:
        tree.started(proc.pid)
        tracker.add(tree)
        assert proc.wait(timeout=30) == 0
        pids = written_pids(pid_file)
        assert alive(pids) == pids and len(pids) == 1  # an orphan now, in another session
        assert tree.reap() >= set(pids)
        wait_for(lambda: alive(pids) == [], timeout=30, what="the orphan to be gone")
        assert tree.members() == set()
        if mode == "cgroup":
            assert not os.path.exists(tree.cgroup or "")
    finally:
        proc.kill()
        kill_all(written_pids(pid_file))


# Counts its SIGTERMs; its handler takes a while (a save), as a script's may.
_COUNTS_SIGTERMS = """
import os, signal, sys, time
def on_term(_signum, _frame):
    with open(sys.argv[1], "a") as log:
        log.write("term\\n")
    time.sleep(1.0)
    sys.exit(42)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[1], "a").close()
time.sleep(60)
"""


@pytest.mark.parametrize("mode", modes())
def test_a_task_signalled_through_its_group_is_not_signalled_again(tmp_path: Path, mode: str):
    # The agent signals a task's process group, then the tree's members (its
    # orphans): the group's own processes must not get the signal twice, or a
    # script's SIGTERM handler (a save) runs twice.
    log = tmp_path / "terms.txt"
    token = os.urandom(8).hex()
    tree = TaskTree(f"MGPU_TASK_TOKEN={token}".encode(),
                    cgroup_home() if mode == "cgroup" else None)
    proc = subprocess.Popen([sys.executable, "-c", _COUNTS_SIGTERMS, str(log)],
                            env={**os.environ, "MGPU_TASK_TOKEN": token},
                            preexec_fn=tree.preexec(os.setsid))
    try:
        tree.started(proc.pid)
        wait_for(log.exists, timeout=30, what="the script to install its handler")
        os.killpg(proc.pid, signal.SIGTERM)
        wait_for(lambda: log.read_text(), timeout=10, what="the handler to run")
        tree.signal(signal.SIGTERM, but_group=proc.pid)  # while the handler runs
        assert proc.wait(timeout=30) == 42
        assert log.read_text().split() == ["term"]
    finally:
        proc.kill()
        tree.reap()
