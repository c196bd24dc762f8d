"""Slurm as a transport, against a real Slurm on this machine (tests/slurmcluster.py):
slurmctld and one slurmd per node, real `salloc`/`srun`/`sbatch`, real
TensorFlow workers, real `kill -9`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.slurmcluster import SlurmCluster, slurm_cluster, unavailable

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
