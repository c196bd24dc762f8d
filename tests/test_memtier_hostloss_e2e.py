"""The memory tier after the loss of a whole host, for real: TF's custom-loop
tutorial (its own CheckpointManager, tests/scripts/tutorial_ctl_big.py) on two
simulated SSH hosts with `checkpoint: {memory: true}`. Each chief save's
second copy is worker1's own save of it in host1's memory (the same bytes,
checked: nothing is sent); then host0 (the chief's) dies the way a machine
does (`SimCluster.kill_host`: its memory copies go with its agent, swept by
the next one). When its sshd is back the launcher places host1's save of the
newest checkpoint in host0's memory, through the launcher; the chief restores
from it, checksummed, worker1 from its own memory; the final weights equal an
uninterrupted run's with the same seed."""

from __future__ import annotations

import glob
import os
import re
import secrets
import threading
from pathlib import Path

import pytest

from launcher.agent.memcopy import job_folder
from tests.conftest import SCRIPTS, alive, read_summary, start_cli, wait_for
from tests.sshcluster import sim_cluster, write_yaml
from tests.test_faults import Job
from tests.test_faults_ssh import SSHJob

pytestmark = pytest.mark.e2e
SCRIPT = str(SCRIPTS / "tutorial_ctl_big.py")
ARGS = ["64", "3"]  # hidden width (a small model), epochs (a save after each)


class MemoryJob(SSHJob):
    """The tutorial on the simulated hosts, the memory tier on; its chief
    holds after epoch 1's save (HOLD_AT) until the test takes host0 away."""

    def __init__(self, cluster, workdir: Path) -> None:  # noqa: D107 - SSHJob's, its own script
        self.cluster = cluster
        self.run_name = f"memhost-{secrets.token_hex(3)}"
        self.ckpt = workdir / "ckpt"
        config = cluster.config_dict()
        config.update(name="memhost", env={"HOLD_AT": "1"},
                      checkpoint={"dir": str(self.ckpt), "memory": True, "memory_copies": 2},
                      restart={"heartbeat_timeout_s": 3, "backoff_s": 0,
                               "on_host_loss": "wait", "host_wait_s": 60})
        path = write_yaml(workdir / "cluster.yaml", config)
        Job.__init__(self, [str(path), SCRIPT, str(self.ckpt), *ARGS], workdir,
                     workdir / self.run_name)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with sim_cluster(tmp_path_factory.mktemp("sim"), 2) as sim:
        yield sim


@pytest.fixture
def jobs():
    started: list[SSHJob] = []
    yield started
    for job in started:
        job.kill_everything()


def test_a_lost_hosts_restart_restores_from_the_copy_in_another_hosts_memory(
        cluster, workdir: Path, jobs):
    local = workdir / "local.yaml"
    local.write_text("transport: local\nrestart: {backoff_s: 0}\n"
                     "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    baseline = start_cli(["--run-dir", str(workdir / "base"), str(local), SCRIPT,
                          str(workdir / "plain"), *ARGS], cwd=workdir)
    job = MemoryJob(cluster, workdir)
    jobs.append(job)
    try:
        wait_for(lambda: job.said("HOLDING") and job.events(
            "memory_copy", host="host1", checkpoint="ckpt-2"), timeout=150,
            what="epoch 1's save (ckpt-2) held in host1's memory, the chief holding")
        job.look()
        killed = cluster.kill_host(0)
        job.wait_event("host_lost", timeout=30, host="host0")
        wait_for(lambda: not alive(killed), timeout=10, what="host0's processes to die")
        cluster.start_host(0)  # the machine boots again, its memory empty
        code = job.finish(timeout=180)
        base_out, _ = baseline.communicate(timeout=120)
    finally:
        baseline.kill()
        cluster.start_host(0)
    assert code == 0, job.output[-4000:]
    check_restore(job)
    assert baseline.returncode == 0, base_out[-3000:]
    assert final_digest(base_out) == final_digest(job.output)
    # The job's memory folders are gone on both hosts (host0's old one swept).
    runs = glob.glob(os.path.expanduser(f"~/.mgpu-launch/runs/{job.run_name}-*"))
    folders = [job_folder(os.path.join(r, h), h) for r in runs for h in ("host0", "host1")]
    assert folders and not [f for f in folders if os.path.exists(f)], folders
    job.assert_nothing_left()


def check_restore(job: MemoryJob) -> None:
    """ckpt-2 held in host1's memory as worker1's own save (the chief's, byte
    for byte: not sent), then placed on host0 from there, each chunk a frame
    through the launcher (raw bytes over the SSH channels); each worker
    restored it, the chief from that copy, worker1 from its own memory."""
    routine = job.events("memory_copy", placed=False)
    assert [(e["checkpoint"], e["host"], e.get("covered_by"), e["bytes"]) for e in routine] \
        == [(f"ckpt-{n}", "host1", "worker1", 0) for n in (1, 2, 3)], routine
    [placed] = job.events("memory_copy", placed=True)
    assert (placed["host"], placed["source"], placed["origin"], placed["checkpoint"]) == (
        "host0", "host1", "host0", "ckpt-2"), placed
    assert "error" not in placed and placed["bytes"] > 100_000, placed
    assert "memory tier: ckpt-2 of host0 placed in host0's memory from host1's" in job.output
    told = {e["task"]: (e["resumed"], e.get("resumed_from"), e.get("resumed_host"))
            for e in job.events("progress", generation=1) if "resumed" in e}
    assert told == {"worker0": (20, "peer", "host1"), "worker1": (20, "memory", "host1")}, told
    [resumed] = job.events("resumed")
    assert resumed["step"] == 20 and resumed["copy"]["host"] == "host1", resumed
    # The first task to tell, named, with its own copy.
    assert told[resumed["copy"]["task"]][1] == resumed["copy"]["from"], resumed
    summary = read_summary(job.run_dir)
    assert summary["restarts"] == 1 and summary["failures"][0]["kind"] == "host_lost", summary
    assert 'model_checkpoint_path: "ckpt-3"' in (job.ckpt / "checkpoint").read_text()


def final_digest(output: str) -> str:
    found = re.findall(r"FINAL ([0-9a-f]{64})", output)
    assert len(found) == 1, output[-3000:]
    return found[0]
