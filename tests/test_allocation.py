"""The batch allocation trait for any batch system (launcher/spec/allocation.py):
a batch system made here, its module and its transport row only, gets the
run command's `--NAME` option, the config of every node, `address: NAME:N`,
its ports from the job id and the words of a SIGTERM — nothing of Slurm.
"""

from __future__ import annotations

import sys
import types

import pytest

from launcher.commands import loading
from launcher.commands import run as run_command
from launcher.spec import allocation, transports
from launcher.spec.allocation import Allocation, AllocationError, BatchSystem
from launcher.spec.config import ConfigError, parse_config


def _read(environ) -> Allocation:
    if "PBS_JOBID" not in environ:
        raise AllocationError("not inside a PBS job (PBS_JOBID is not set): qsub it")
    return Allocation(job_id=environ["PBS_JOBID"], nodes=tuple(environ["PBS_NODES"].split(",")),
                      gpus=())


PBS = BatchSystem(name="pbs", title="PBS", read=_read, ended=lambda job: False,
                  why_stopped=lambda job: f"the PBS job {job} was deleted (qdel)",
                  auto_port_base=lambda job: 31000, more_nodes=lambda n: f"`-l nodes={n}`",
                  option_help="run on the nodes of this PBS job")


@pytest.fixture
def pbs(monkeypatch):
    """PBS as the batch system of the allocation transport's row."""
    module = types.ModuleType("launcher.spec.pbs")
    module.SYSTEM = PBS
    monkeypatch.setitem(sys.modules, "launcher.spec.pbs", module)
    row = transports.TRANSPORTS[transports.TransportName.SLURM]
    monkeypatch.setitem(transports.TRANSPORTS, transports.TransportName.SLURM,
                        transports.Traits(module=row.module, allocation="pbs"))
    monkeypatch.setenv("PBS_JOBID", "77.server")
    monkeypatch.setenv("PBS_NODES", "cn1,cn2,cn3")
    return PBS


def test_a_batch_system_is_its_module_and_a_row(pbs, capsys, tmp_path, monkeypatch):
    assert allocation.systems() == [pbs]
    loaded = loading.load_cluster(None, None, "pbs")  # `--pbs`: every node, one worker each
    assert [h.address for h in loaded.config.hosts] == ["cn1", "cn2", "cn3"]
    assert loaded.config.ports.base == 31000
    assert allocation.system_of(loaded.config.transport).why_stopped("77.server") == \
        "the PBS job 77.server was deleted (qdel)"
    monkeypatch.chdir(tmp_path)
    assert run_command.main(["--pbs", "--dry-run", "train.py"]) == 0  # the run command's option
    plan = capsys.readouterr().out
    assert "cn3" in plan and "worker2" in plan, plan


def test_hosts_by_position_and_nodes_outside_the_allocation(pbs):
    text = ("name: p\ntransport: slurm\nhosts:\n  - {address: 'pbs:2'}\n  - {address: cn1}\n"
            "  - {address: other}\n  - {address: 'pbs:9'}\n")
    loaded = parse_config(text, source="p.yaml")
    with pytest.raises(ConfigError) as info:
        allocation.with_allocation(loaded, pbs.read({"PBS_JOBID": "77.server",
                                                     "PBS_NODES": "cn1,cn2,cn3"}))
    said = "\n".join(info.value.problems)
    assert "'other' is not a node of PBS job 77.server" in said, said
    assert "'pbs:9', but PBS job 77.server has 3 node(s): allocate at least 4 " \
           "(`-l nodes=4`)" in said, said
    placed = allocation.with_allocation(
        parse_config(text.replace("  - {address: other}\n  - {address: 'pbs:9'}\n", ""),
                     source="p.yaml"), pbs.read({"PBS_JOBID": "7", "PBS_NODES": "cn1,cn2,cn3"}))
    assert [h.address for h in placed.config.hosts] == ["cn3", "cn1"]


def test_outside_the_allocation_the_option_says_how_to_get_one(pbs, monkeypatch):
    monkeypatch.delenv("PBS_JOBID")
    with pytest.raises(AllocationError, match="not inside a PBS job"):
        loading.load_cluster(None, None, "pbs")
