"""Run folders on a host (`~/.mgpu-launch/runs/…`) do not pile up: a real agent
prunes them when it starts (launcher/hostruns.py), never one in use."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from launcher import hostruns
from tests.agentproc import AgentProc


def _run_folder(root: Path, name: str, age_s: float) -> Path:
    host = root / name / "h1"
    (host / "pids").mkdir(parents=True)
    (host / "TF_CONFIG.worker0.json").write_text("{}")
    when = time.time() - age_s
    for path in (host / "TF_CONFIG.worker0.json", host / "pids", host, root / name):
        os.utime(path, (when, when))
    return root / name


def test_the_agent_keeps_the_recent_and_the_busy_run_folders(tmp_path, monkeypatch):
    root = tmp_path / "home" / ".mgpu-launch" / "runs"
    recent = _run_folder(root, "recent-0000000a", 600)  # 10 min: used within the hour
    old = [_run_folder(root, f"old{i}-0000000{i}", 7200 + 60 * i) for i in range(4)]
    # old1: an agent still holds its lock; old2: a recorded task is alive.
    lock = os.open(old[1] / "h1" / hostruns.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_SH)
    (old[2] / "h1" / "pids" / "worker0-t.json").write_text(json.dumps({"pid": os.getpid()}))
    for path in (old[1] / "h1" / hostruns.LOCK_NAME, old[1] / "h1",
                 old[2] / "h1" / "pids" / "worker0-t.json", old[2] / "h1" / "pids"):
        os.utime(path, (time.time() - 7300, time.time() - 7300))  # old, but busy
    stranger = root / "not-a-run"  # not named as the launcher names run folders
    stranger.mkdir()
    os.utime(stranger, (0, 0))
    monkeypatch.setenv("MGPU_KEEP_RUNS", "1")  # the new run's own folder is the one kept
    agent = AgentProc(root / "new-0000000f" / "h1")
    try:
        agent.hello()
        log = agent.wait_event("log", timeout=30)["text"]
        assert log.startswith("removed 2 old run folder(s)"), log
        assert sorted(p.name for p in root.iterdir()) == [
            hostruns.STAMP_NAME, "new-0000000f", "not-a-run", "old1-00000001", "old2-00000002",
            "recent-0000000a"]
        assert recent.exists()
        # The new agent holds its own folder's lock: a later prune leaves it alone.
        os.utime(root / "new-0000000f", (0, 0))
        assert hostruns.in_use(root / "new-0000000f")
    finally:
        agent.close()
        os.close(lock)
    # Its agent ran no task (nothing of a job in it): gone with the agent.
    assert not (root / "new-0000000f").exists()


def test_an_agent_asked_no_task_leaves_no_run_folder_behind(tmp_path):
    """A launch refused after its agents started (cli.py starts them while it
    plans), or a spare host never used: nothing of a job, nothing left. A
    folder an agent ran a task in stays (its pid records, TF_CONFIG, errors),
    and so does one another agent of the run still holds (a reconnection)."""
    root = tmp_path / "home" / ".mgpu-launch" / "runs"
    refused = [AgentProc(root / "refused-0000000a" / h) for h in ("h1", "h2")]
    ran = AgentProc(root / "ran-0000000b" / "h1")
    first, second = (AgentProc(root / "twice-0000000c" / "h1") for _ in range(2))
    try:
        for agent in (*refused, ran, first, second):
            agent.hello()
        ran.start_task("worker0", ["python3", "-c", "pass"])
        ran.wait_event("exited", task="worker0")
        refused[0].close()
        assert sorted(p.name for p in (root / "refused-0000000a").iterdir()) == ["h2"]
        refused[1].close()
        ran.close()
        first.close()  # the other agent of that folder still holds its lock
        assert (root / "twice-0000000c" / "h1" / hostruns.LOCK_NAME).exists()
        second.close()
    finally:
        for agent in (*refused, ran, first, second):
            agent.close()
    assert sorted(p.name for p in root.iterdir()) == [hostruns.STAMP_NAME, "ran-0000000b"]
    assert (root / "ran-0000000b" / "h1" / "pids").is_dir()
    # The host reached again (a new agent in that folder) and the job over before
    # it got a task: the first agent's files stay.
    kept = sorted(p.relative_to(root) for p in (root / "ran-0000000b").rglob("*"))
    again = AgentProc(root / "ran-0000000b" / "h1")
    try:
        again.hello()
    finally:
        again.close()
    assert sorted(p.relative_to(root) for p in (root / "ran-0000000b").rglob("*")) == kept


def test_a_simulated_hosts_folder_is_never_pruned(tmp_path):
    assert hostruns.runs_root(str(tmp_path / "runs" / "local-1" / "hosts" / "host0")) is None
    assert hostruns.runs_root(str(tmp_path / ".mgpu-launch" / "runs" / "x-00000000" / "h")) == \
        str(tmp_path / ".mgpu-launch" / "runs")


def test_a_runs_folder_is_pruned_at_most_once_in_a_while(tmp_path):
    """Hosts sharing a home (NFS, simulated hosts) walk the runs folder once
    between them, not once each: the stamp, and the lock while one prunes."""
    root = tmp_path / ".mgpu-launch" / "runs"
    _run_folder(root, "old0-00000000", 7200)
    _run_folder(root, "old1-00000001", 7300)
    now = time.time()
    assert hostruns.prune_now_and_then(str(root), keep=1, now=now) == ["old1-00000001"]
    _run_folder(root, "old2-00000002", 7400)
    assert hostruns.prune_now_and_then(str(root), keep=1, now=now + 60) is None  # pruned lately
    assert (root / "old2-00000002").exists()
    stamp = os.open(root / hostruns.STAMP_NAME, os.O_RDWR)
    try:  # another agent prunes now: this one does not wait for it
        fcntl.flock(stamp, fcntl.LOCK_EX)
        later = now + hostruns.PRUNE_EVERY_S + 1
        assert hostruns.prune_now_and_then(str(root), keep=1, now=later) is None
    finally:
        os.close(stamp)
    assert hostruns.prune_now_and_then(str(root), keep=1, now=later) == ["old2-00000002"]
