"""One launch (launcher/job/run/launch.py): its steps before any host is reached,
one transport factory for a run and `check`, and one restart-policy type.

Fast unit tests of the pieces; the whole launch is tested for real by the
end-to-end tests (test_e2e_local, test_terminal, test_detach, test_restarts,
test_ssh_transport, test_slurm), which all go through it.
"""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.job.run import supervisor
from launcher.job.run.launch import Launch, LaunchRefused
from launcher.job.run.reach import Connected
from launcher.spec import config as spec_config
from launcher.spec.config import load_config, local_config
from launcher.transport.factory import make_transport
from launcher.transport.inbox import Inbox
from launcher.transport.local import LocalTransport
from launcher.views import narrate


def _local(tmp_path: Path, **checkpoint: str):
    loaded = replace(local_config(2), base_dir=tmp_path)
    if checkpoint:
        section = loaded.config.checkpoint.model_copy(update=checkpoint)
        loaded = replace(loaded, config=loaded.config.model_copy(update={"checkpoint": section}))
    return loaded


def test_the_supervisor_takes_the_cluster_files_restart_policy():
    """One type, one set of defaults: what `restart:` says is what the supervisor follows."""
    assert supervisor.RestartPolicy is spec_config.RestartPolicy
    policy = spec_config.RestartPolicy()
    assert (policy.max_restarts, policy.warm_standby) == (3, "auto")


class _Screen:
    """A voice that says nothing (the printer's place)."""

    verbose = False
    terminal_lost = terminal_lost_t = None
    dropped = 0

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


def test_max_restarts_overrides_only_that_key(tmp_path: Path):
    """`--max-restarts` is a copy of the cluster file's policy with one key changed."""
    launch = Launch(_local(tmp_path), ["train.py"], tmp_path / "run")
    plan = launch.plan(0)
    connected = Connected(launch.reach, LocalTransport(), {}, Inbox(), plan)
    job = launch.start(connected, _Screen(), max_restarts=0)
    restart = launch.loaded.config.restart
    assert job.supervisor._policy == restart.model_copy(update={"max_restarts": 0})
    assert restart.max_restarts == 3
    assert (tmp_path / "run" / "config.yaml").exists()  # the run directory's first file
    job.recorder.close()


def test_a_fault_of_the_launcher_itself_is_a_fact_worded_by_the_views(tmp_path: Path):
    """The supervisor raising ends the job as failed: a `launcher_failed` event
    (its facts) then `job_done`; the screen is told the event, and the words are
    narrate's, as they always were."""
    import json

    from launcher.job.record import events as ev

    launch = Launch(_local(tmp_path), ["train.py"], tmp_path / "run")
    connected = Connected(launch.reach, LocalTransport(), {}, Inbox(), launch.plan(0))
    told: list[ev.Event] = []
    screen = _Screen()
    screen.tell = told.append
    job = launch.start(connected, screen)

    def broken() -> None:
        raise ZeroDivisionError("division by zero")

    job.supervisor.run = broken
    outcome = job.run()
    assert outcome.result.status == "failed"
    lines = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [line["event"] for line in lines] == ["launcher_failed", "job_done"]
    assert lines[0]["error_type"] == "ZeroDivisionError" and lines[0]["plan"] is False
    assert [e.kind for e in told] == ["launcher_failed"]
    assert narrate.line(told[0]) == (
        "notice", "mgpu-launch itself failed: ZeroDivisionError: division by zero")
    planned = ev.LauncherFailed(error_type="PlanError", error="too few hosts", plan=True)
    assert narrate.line(planned) == ("notice", "cannot go on: too few hosts")
    assert outcome.summary["status"] == "failed"


def test_a_busy_default_checkpoint_dir_moves_aside(tmp_path: Path):
    first = Launch(_local(tmp_path), ["train.py"], tmp_path / "run1")
    assert first.claim_checkpoint_dir() is None  # free: kept, nothing to say
    second = Launch(_local(tmp_path), ["train.py"], tmp_path / "run2")
    moved = second.claim_checkpoint_dir()
    assert moved is not None and str(moved.wanted) == first.plan(0).checkpoint_dir
    assert str(moved.used) == second.plan(0).checkpoint_dir == str(moved.wanted) + "-2"
    # The command says it in narrate's words (a value here, words there).
    assert narrate.checkpoint_moved(moved) == (
        f"{moved.wanted} is in use by another run: this run uses {moved.used} "
        "(it starts from scratch)")


def test_prepare_claims_plans_and_returns_a_move(tmp_path: Path):
    """The preamble that the run command and the drill share: the checkpoint
    directory claimed (a move returned), generation 0 planned; a detached run's
    parent (claim=False) claims nothing."""
    first = Launch(_local(tmp_path), ["train.py"], tmp_path / "run1").prepare()
    assert first.moved is None
    parent = Launch(_local(tmp_path), ["train.py"], tmp_path / "run2").prepare(claim=False)
    assert parent.plan.checkpoint_dir == first.plan.checkpoint_dir and parent.moved is None
    second = Launch(_local(tmp_path), ["train.py"], tmp_path / "run3").prepare()
    assert second.plan.checkpoint_dir == first.plan.checkpoint_dir + "-2"
    assert second.moved is not None and str(second.moved.used) == second.plan.checkpoint_dir


def test_a_busy_named_checkpoint_dir_is_refused(tmp_path: Path):
    named = str(tmp_path / "ckpt")
    Launch(_local(tmp_path, dir=named), ["train.py"], tmp_path / "run1").claim_checkpoint_dir()
    with pytest.raises(LaunchRefused, match="must not share a checkpoint directory"):
        Launch(_local(tmp_path, dir=named), ["train.py"],
               tmp_path / "run2").claim_checkpoint_dir()


def test_busy_ports_are_refused_naming_the_port(tmp_path: Path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    try:
        port = holder.getsockname()[1]
        launch = Launch(_local(tmp_path), ["train.py"], tmp_path / "run")
        plan = launch.plan(0, ports=[port, port + 1 if port < 65535 else port - 1])
        with pytest.raises(LaunchRefused, match=f"already in use on this machine: {port}"):
            launch.check_ports(plan)
    finally:
        holder.close()


def test_one_transport_factory_for_a_run_and_check(tmp_path: Path):
    local = local_config(2).config
    run = make_transport(local)
    assert isinstance(run, LocalTransport)
    assert run._lease_s == local.restart.heartbeat_timeout_s  # the lease is the heartbeat
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("hosts:\n  - address: 127.0.0.2\n")
    ssh = load_config(cluster).config
    from launcher.transport.ssh import SSHTransport

    assert make_transport(ssh)._require_tf is True
    checking = make_transport(ssh, checking=True)
    assert isinstance(checking, SSHTransport) and checking._require_tf is False
