"""`mgpu-launch simulate` owns its folder: a second start on a folder whose
hosts run is refused (keys, pid files and the running sshds untouched), and
`simulate stop` leaves no process of that folder, open sessions included.
Real sshds on loopback, a real ssh client session."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import yaml

from tests.conftest import run_cli, wait_for

SSHD = os.environ.get("MGPU_SSHD", "/usr/sbin/sshd")


def processes_of(folder: Path) -> list[psutil.Process]:
    """Every process whose command line names something in `folder`."""
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(folder) in arg for arg in proc.info.get("cmdline") or ()):
            out.append(proc)
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.suffix != ".log"
            and p.name not in ("sshd.out", ".simulate.lock")}


def test_simulate_twice_on_one_folder_is_refused_and_stop_leaves_nothing(tmp_path: Path):
    assert os.path.exists(SSHD), f"no sshd at {SSHD}: apt-get install openssh-server"
    sim = tmp_path / "sim"
    start = ["simulate", "2", "--dir", str(sim), "--detach", "--first-address", "127.0.91.2"]
    session = None
    duration = f"299.{os.getpid()}"  # a command line no other test's `sleep` has
    try:
        first = run_cli(start, cwd=tmp_path, timeout=60)
        assert first.returncode == 0, first.stderr
        before = snapshot(sim)
        listeners = sorted(int(p.read_text()) for p in sim.glob("host*/sshd.pid"))
        assert len(listeners) == 2
        port = yaml.safe_load((sim / "cluster.yaml").read_text())["ssh"]["port"]
        # A session on host0 that runs a command: stop must end it too.
        session = subprocess.Popen(
            ["ssh", "-i", str(sim / "client_key"), "-p", str(port), "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={sim / 'known_hosts'}", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "127.0.91.2", f"exec sleep {duration}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        sleeper = wait_for(lambda: [p for p in psutil.process_iter(["cmdline"])
                                    if p.info.get("cmdline") == ["sleep", duration]
                                    and session.poll() is None], 30, "the ssh session's sleep")

        again = run_cli(start, cwd=tmp_path, timeout=60)
        assert again.returncode == 2, again.stdout + again.stderr
        assert "already has 2 simulated host(s) running" in again.stderr
        assert f"simulate stop --dir {sim}" in again.stderr
        assert snapshot(sim) == before  # keys, configs, pid files untouched
        assert sorted(int(p.read_text()) for p in sim.glob("host*/sshd.pid")) == listeners
        assert all(psutil.pid_exists(pid) for pid in listeners)

        stopped = run_cli(["simulate", "stop", "--dir", str(sim)], cwd=tmp_path, timeout=60)
        assert stopped.returncode == 0 and "stopped 2 simulated host(s)" in stopped.stdout
        # Nothing of that folder is left: no listener, no session, not what it ran.
        assert not [p for p in sleeper if p.is_running()
                    and p.status() != psutil.STATUS_ZOMBIE]
        wait_for(lambda: session.poll() is not None, 10, "the ssh client to see the end")
        left = [p for p in processes_of(sim) if p.status() != psutil.STATUS_ZOMBIE]
        assert not left, [p.cmdline() for p in left]
    finally:
        if session is not None and session.poll() is None:
            session.kill()
        run_cli(["simulate", "stop", "--dir", str(sim)], cwd=tmp_path, timeout=60)
