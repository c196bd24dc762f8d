"""Slurm as a transport, against a real Slurm on this machine (tests/slurmcluster.py):
slurmctld and one slurmd per node, real `salloc`/`srun`/`sbatch`, real
TensorFlow workers, real `kill -9`."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import PYTHON, cli_env, read_events, read_summary
from tests.slurmcluster import SlurmCluster, slurm_cluster, unavailable
from tests.sshcluster import TINY_TRAIN, write_script

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "ok")]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(3) as cluster:
        yield cluster


def test_the_cluster_runs_one_task_per_node(slurm: SlurmCluster):
    done = slurm.run(["srun", "-N2", "-n2", "--ntasks-per-node=1", "bash", "-c",
                      "echo $SLURMD_NODENAME $SLURM_JOB_NODELIST"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split("\n")[:2]) == ["node1 node[1-2]", "node2 node[1-2]"]


def _salloc(slurm: SlurmCluster, nodes: int, args: list[str], cwd: Path, timeout: float = 300,
            **env: str) -> subprocess.CompletedProcess:
    """`salloc -N nodes mgpu-launch ARGS`: the launcher inside a fresh allocation."""
    return subprocess.run(["salloc", f"-N{nodes}", "--quiet", PYTHON, "-m", "launcher", *args],
                          cwd=cwd, env=_env(slurm, **env), capture_output=True, text=True,
                          timeout=timeout)


def _env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    """The CLI's environment in this cluster (nothing of an outer allocation)."""
    return slurm.env(**{k: v for k, v in cli_env(**extra).items() if not k.startswith("SLURM")})


def test_slurm_shorthand_trains_on_the_allocations_nodes(slurm: SlurmCluster, workdir: Path):
    script = write_script(workdir, "tiny.py", TINY_TRAIN)
    run_dir = workdir / "run"
    done = _salloc(slurm, 2, ["--slurm", "--run-dir", str(run_dir), str(script)], workdir)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    digests = re.findall(r"^(node[12]/worker[01]) +\| weights digest (\w+)", done.stdout, re.M)
    assert sorted(label for label, _ in digests) == ["node1/worker0", "node2/worker1"], (
        done.stdout[-2000:])
    assert digests[0][1] == digests[1][1]
    summary = read_summary(run_dir)
    assert summary["status"] == "succeeded" and summary["restarts"] == 0
    events = [e["event"] for e in read_events(run_dir)]
    assert events[0] == "launch" and events[-1] == "job_done"
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "node1-worker0.log", "node2-worker1.log"]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["transport"] == "slurm"
    assert [h["address"] for h in config["hosts"]] == ["node1", "node2"]
