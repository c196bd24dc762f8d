"""Keras 3 on JAX across processes: `strategy: keras_distribution`.

Config and plan checks are pure; the end-to-end tests run the bundled example
(examples/keras_jax/train.py) as real JAX processes on simulated hosts, local
and over real sshds, and kill one with a real SIGKILL.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from launcher.runtime import keras_jax, keras_savers
from launcher.spec.config import ConfigError, parse_config
from launcher.spec.plan import build_plan
from tests.conftest import EXAMPLES, SCRIPTS, read_events, read_summary, run_cli
from tests.sshcluster import sim_cluster, write_yaml
from tests.test_faults import jobs, launch  # noqa: F401 - `jobs` is a fixture

EXAMPLE = str(EXAMPLES / "keras_jax" / "train.py")
CHECKSUM = re.compile(r"^(host\d)/worker\d +\| WEIGHTS_CHECKSUM ([-0-9.]+)", re.M)
NUM_PROCESSES = re.compile(r"^(host\d)/worker\d +\| test accuracy: ([0-9.]+) "
                           r"\(process (\d), num_processes (\d)\)", re.M)

import jax  # noqa: E402,F401 - the [dev] extra has it: no test here may be skipped for it

YAML = """\
strategy: keras_distribution
keras: jax
transport: local
hosts:
  - {address: 127.0.0.1, name: host0, roles: {chief: 1}}
  - {address: 127.0.0.1, name: host1, roles: {worker: 2}}
ports: {base: 24000}
restart: {heartbeat_timeout_s: 4.5, hang_timeout_s: 60, start_timeout_s: 90}
"""


# ------------------------------------------------------------------ config, plan


def problems(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, source="c.yaml")
    return "\n".join(caught.value.problems)


HOSTS = "hosts:\n  - {address: 127.0.0.1}\n"


@pytest.mark.parametrize("text, expected", [
    ("strategy: keras_distribution\nkeras: tf_keras\n" + HOSTS,
     "c.yaml:2: keras: keras_distribution is Keras 3's multi-process path; tf_keras has none"),
    ("strategy: keras_distribution\n" + HOSTS,
     "keras_distribution needs the Keras backend: set `keras: jax`"),
    ("strategy: keras_distribution\nenv: {KERAS_BACKEND: tensorflow}\n" + HOSTS,
     "keras_distribution runs on jax, not KERAS_BACKEND=tensorflow"),
    ("strategy: keras_distribution\nkeras: jax\nenv: {KERAS_BACKEND: torch}\n" + HOSTS,
     "KERAS_BACKEND=torch contradicts `keras: jax`"),
    ("keras: jax\n" + HOSTS, "keras: jax runs Keras 3 on JAX, which trains across hosts with "
     "strategy: keras_distribution, not multi_worker_mirrored"),
    ("strategy: keras_distribution\nkeras: jax\nhosts:\n  - {address: a, roles: {worker: 1, "
     "ps: 1}}\ntransport: local\n", "keras_distribution runs every task as one training "
     "process: no ps tasks"),
    ("strategy: keras_distribution\nkeras: jax\nhosts:\n  - {address: a, roles: {worker: 1, "
     "evaluator: 1}}\ntransport: local\n", "no evaluator tasks"),
])
def test_bad_keras_distribution_configs_are_clear_errors(text, expected):
    assert expected in problems(text)


def test_keras_backend_from_env_is_accepted():
    loaded = parse_config("strategy: keras_distribution\nenv: {KERAS_BACKEND: jax}\n"
                          "transport: local\nports: {base: 24000}\n" + HOSTS)
    task = build_plan(loaded, ["train.py"], run_dir="/r").tasks[0]
    assert task.env["KERAS_BACKEND"] == "jax"


def test_plan_gives_each_process_its_id_the_addresses_and_jax_timeouts():
    plan = build_plan(parse_config(YAML), ["train.py"], run_dir="/r")
    addresses = "127.0.0.1:24000,127.0.0.1:24001,127.0.0.1:24002"
    assert [(t.name, t.port) for t in plan.tasks] == [
        ("chief0", 24000), ("worker0", 24001), ("worker1", 24002)]
    for process, task in enumerate(plan.tasks):  # chief first: process 0, JAX's coordinator
        assert task.env["KERAS_DISTRIBUTION_PROCESS_ID"] == str(process)
        assert task.env["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == addresses
        assert task.env["KERAS_DISTRIBUTION_NUM_PROCESSES"] == "3"
        assert task.env["KERAS_BACKEND"] == "jax"
        assert task.env["MGPU_STRATEGY"] == "keras_distribution"
        # From the restart policy, rounded up to JAX's whole seconds.
        assert (task.env["MGPU_JAX_HEARTBEAT_S"], task.env["MGPU_JAX_SHUTDOWN_S"],
                task.env["MGPU_JAX_INIT_TIMEOUT_S"]) == ("5", "60", "90")
    # The runtime derives the same from TF_CONFIG (plans of other strategies).
    for process, task in enumerate(plan.tasks):
        os.environ["TF_CONFIG"] = task.tf_config_json()
        try:
            derived = keras_jax.cluster_env()
        finally:
            del os.environ["TF_CONFIG"]
        assert derived == {k: task.env[k] for k in derived}, process


def test_env_knob_wins_over_the_restart_policy():
    text = YAML + "env: {MGPU_JAX_HEARTBEAT_S: 2}\n"
    task = build_plan(parse_config(text), ["train.py"], run_dir="/r").tasks[0]
    assert task.env["MGPU_JAX_HEARTBEAT_S"] == "2"


def test_shard_arrays_gives_disjoint_equal_shares():
    x, y = np.arange(11), np.arange(11) * 10
    shares = [keras_jax.shard_arrays(x, y, process=p, count=3) for p in range(3)]
    assert [len(sx) for sx, _ in shares] == [3, 3, 3]  # the remainder is dropped
    assert sorted(np.concatenate([sx for sx, _ in shares]).tolist()) == [0, 1, 2, 3, 4, 5, 6,
                                                                           7, 8]
    assert all((sy == sx * 10).all() for sx, sy in shares)
    assert keras_jax.shard_arrays(x, process=0, count=1).tolist() == x.tolist()
    with pytest.raises(ValueError, match="different lengths"):
        keras_jax.shard_arrays(x, y[:5], process=0, count=2)


def test_timeouts_reach_jax_distributed_initialize():
    import types

    seen = {}
    fake = types.SimpleNamespace(initialize=lambda **kwargs: seen.update(kwargs))
    os.environ["MGPU_JAX_HEARTBEAT_S"] = "4"
    try:
        keras_jax.on_jax_distributed(fake)
        keras_jax.on_jax_distributed(fake)  # idempotent
        fake.initialize(coordinator_address="h:1", shutdown_timeout_seconds=7)
    finally:
        del os.environ["MGPU_JAX_HEARTBEAT_S"]
    assert seen == {"coordinator_address": "h:1", "heartbeat_timeout_seconds": 4,
                    "shutdown_timeout_seconds": 7, "initialization_timeout": 600}


# -------------------------------------------------------------------- end to end


def assert_same_weights_everywhere(output: str, processes: int = 2) -> None:
    sums = dict(CHECKSUM.findall(output))
    assert len(sums) == processes and len(set(sums.values())) == 1, output[-3000:]
    seen = NUM_PROCESSES.findall(output)
    assert sorted(int(p) for _, _, p, _ in seen) == list(range(processes)), output[-3000:]
    assert {int(n) for _, _, _, n in seen} == {processes}
    assert all(float(acc) > 0.8 for _, acc, _, _ in seen), seen


@pytest.mark.e2e
def test_example_trains_with_two_local_processes(workdir: Path):
    run_dir = workdir / "run"
    done = run_cli(["--local", "2", "--no-live", "--run-dir", str(run_dir), EXAMPLE,
                    "--epochs", "4"], cwd=workdir, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert_same_weights_everywhere(done.stdout)
    assert read_summary(run_dir)["status"] == "succeeded"
    assert {e["task"] for e in read_events(run_dir) if e["event"] == "progress"} == {
        "worker0", "worker1"}


@pytest.mark.e2e
def test_kill_9_of_process_1_restarts_and_resumes_from_the_checkpoint(workdir: Path, jobs):  # noqa: F811
    (workdir / "cluster.yaml").write_text(
        "name: kj\nstrategy: keras_distribution\nkeras: jax\ntransport: local\n"
        "hosts:\n  - {address: 127.0.0.1, name: host0}\n  - {address: 127.0.0.1, name: host1}\n"
        "ports: {base: auto}\nrestart: {backoff_s: 0}\n")
    job = launch(jobs, ["--no-live", str(workdir / "cluster.yaml"), EXAMPLE,
                        "--epochs", "4", "--batch-per-process", "8"], workdir)
    # Process 1 in (0-based) epoch 2: the chief saved the backup of epoch 2's start.
    job.wait_event("progress", timeout=180, task="worker1", epoch=2)
    victim = job.pids()[(0, "worker1")]
    os.kill(victim, signal.SIGKILL)
    code = job.finish(timeout=240)
    assert code == 0, job.output[-4000:]
    summary = read_summary(job.run_dir)
    assert summary["restarts"] == 1, summary
    assert summary["failures"][0]["task"] == "host1/worker1"
    assert summary["failures"][0]["signal"] == 9
    # Generation 1 resumed from the backup: it began at the epoch that was killed
    # (0-based 2) or, when the kill came right after that epoch's backup, the next
    # one; never from the first. Read from its own progress reports, not timing.
    resumed = {e["epoch"] for e in job.events("progress", generation=1, task="worker1")
               if "epoch" in e}
    assert resumed and min(resumed) >= 2, resumed
    first = re.findall(r"^host1/worker1 +\| Epoch (\d+)/4", job.output, re.M)
    assert first and int(first[0]) == 1  # generation 0 did start from the first
    assert_same_weights_everywhere(job.output)
    job.assert_nothing_left()


@pytest.mark.e2e
def test_an_error_in_one_process_is_named_at_once_not_as_a_hang_of_its_peer(workdir: Path):
    """JAX's exit handler waits in a barrier for every process, while the peer
    waits in a collective for the failed one: before, the job failed after
    `hang_timeout_s`, blamed on the peer. Now the failed process leaves at once."""
    (workdir / "cluster.yaml").write_text(
        "strategy: keras_distribution\nkeras: jax\ntransport: local\n"
        "hosts:\n  - {address: 127.0.0.1, name: host0}\n  - {address: 127.0.0.1, name: host1}\n"
        "ports: {base: auto}\nrestart: {max_restarts: 0, hang_timeout_s: 200}\n"
        "env: {RAISE_AT_STEP: '10'}\n")
    run_dir = workdir / "run"
    done = run_cli(["--no-live", "--run-dir", str(run_dir), str(workdir / "cluster.yaml"),
                    str(SCRIPTS / "tutorial_keras_jax_backup.py"), str(workdir / "backup")],
                   cwd=workdir, timeout=180)  # under the hang timeout: a hang fails here
    assert done.returncode != 0
    summary = read_summary(run_dir)
    assert summary["failures"][0]["task"] == "host0/worker0", summary["failures"]
    assert "ValueError: bad data at step 10" in done.stdout
    assert "root cause: host0/worker0" in done.stdout and "made no progress" not in done.stdout


@pytest.mark.e2e
def test_two_processes_over_ssh_train_to_the_same_weights(tmp_path: Path):
    with sim_cluster(tmp_path / "sim", 2) as cluster:
        config = cluster.config_dict()
        config.update(name="kj-ssh", strategy="keras_distribution", keras="jax")
        config["checkpoint"] = {"dir": str(tmp_path / "checkpoints")}
        path = write_yaml(tmp_path / "cluster.yaml", config)
        done = run_cli(["--no-live", "--run-dir", str(tmp_path / "run"), str(path), EXAMPLE,
                        "--epochs", "3"], cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert_same_weights_everywhere(done.stdout)
    # Process 0's address and port are JAX's coordinator, on its simulated host.
    assert re.search(r"process 0 of 2", done.stdout)
    assert cluster.hosts[0].address != cluster.hosts[1].address


# ------------------------------------------------------------------------ check


def host_report(name: str, jax_version: str | None, jaxlib_version: str | None):
    from launcher.commands.check_verdict import HostReport
    from launcher.spec.plan import HostTarget

    host = HostTarget(name=name, address=name, python="python3", gpus=(), ssh_user=None,
                      ssh_port=22, identity_file=None, known_hosts="~/.ssh/known_hosts",
                      host_key_policy="strict", ssh_config_file=None, connect_timeout_s=10.0)
    packages = {"tensorflow": "2.21.0", "keras": "3.15.1", "tf_keras": "2.21.0"}
    return HostReport(host, hello={"python": "python3", "python_version": "3.11.7",
                                   "packages": packages},
                      jax={"jax": jax_version, "jaxlib": jaxlib_version}, keras_backend="jax")


def test_check_flags_missing_mismatched_and_differing_jax():
    from launcher.commands.check_verdict import judge_versions, render

    reports = [host_report("a", "0.10.2", "0.10.2"), host_report("b", "0.10.2", "0.10.2"),
               host_report("c", "0.10.1", "0.10.1"), host_report("d", "0.10.2", "0.10.1"),
               host_report("e", None, None)]
    judge_versions(reports, "jax", backend="jax")
    problems = {r.host.name: " | ".join(r.problems) for r in reports}
    assert problems["a"] == problems["b"] == ""
    assert "jax 0.10.1 here, but 0.10.2 on a, b" in problems["c"]
    assert "jaxlib 0.10.1 does not match jax 0.10.2" in problems["d"]
    assert "jax is not installed for python3" in problems["e"]
    table = render(reports, "/ckpt", ports_fixed=False).splitlines()
    assert table[0].split()[7:9] == ["BACKEND", "JAX"]
    assert table[1].split()[7:9] == ["jax", "0.10.2"]
    assert table[4].split()[7:9] == ["jax", "0.10.2/jaxlib"]
    # A TensorFlow job does not judge jax at all.
    tf_only = [host_report("a", None, None)]
    judge_versions(tf_only, "auto")
    assert tf_only[0].problems == []


@pytest.mark.e2e
def test_a_hung_process_is_caught_by_jax_heartbeat_and_the_job_restarts(workdir: Path, jobs):  # noqa: F811
    (workdir / "cluster.yaml").write_text(
        "name: kj-hang\nstrategy: keras_distribution\nkeras: jax\ntransport: local\n"
        "hosts:\n  - {address: 127.0.0.1, name: host0}\n  - {address: 127.0.0.1, name: host1}\n"
        "ports: {base: auto}\nrestart: {backoff_s: 0, heartbeat_timeout_s: 3}\n")
    job = launch(jobs, ["--no-live", str(workdir / "cluster.yaml"), EXAMPLE,
                        "--epochs", "3", "--batch-per-process", "8"], workdir)
    job.wait_event("progress", timeout=180, task="worker1", epoch=1)
    job.look()
    stopped_at = time.time()
    os.kill(job.pids()[(0, "worker1")], signal.SIGSTOP)
    failure = job.wait_event("failure_detected", timeout=60, generation=0)
    # JAX's coordinator (heartbeat 3 s, from restart.heartbeat_timeout_s) aborts the
    # peer: seconds, not JAX's default 100 s nor the launcher's hang_timeout_s.
    assert failure["t"] - stopped_at < 15, failure
    code = job.finish(timeout=240)
    assert code == 0, job.output[-4000:]
    assert "stopped sending heartbeats" in job.output
    summary = read_summary(job.run_dir)
    assert summary["restarts"] == 1
    # The hung process is the root cause, not the survivor JAX aborted (SIGABRT).
    cause = summary["failures"][0]
    assert cause["task"] == "host1/worker1" and cause["kind"] == "hang", cause
    assert "reported by host0/worker0" in cause["description"]
    assert_same_weights_everywhere(job.output)
    job.assert_nothing_left()


def test_the_chiefs_backup_is_renamed_into_place_and_keeps_its_previous_copy(tmp_path):
    from keras.src.callbacks.backup_and_restore import BackupAndRestore

    class Backup(BackupAndRestore):  # a subclass: the test patches nothing shared
        pass

    written = []

    def fake_inner_save(self):  # what Keras does: write both files at the current paths
        for path in (self._weights_path, self._training_metadata_path):
            written.append(os.path.dirname(path))
            Path(path).write_text(f"epoch {self._current_epoch}")

    Backup._save_model = fake_inner_save
    keras_savers.atomic_backups(Backup, chief=lambda: True)
    backup = Backup(str(tmp_path / "b"), double_checkpoint=True)
    for epoch in (1, 2):
        backup._current_epoch = epoch
        backup._save_model()
    folder = tmp_path / "b"
    assert (folder / "latest.weights.h5").read_text() == "epoch 2"
    assert (folder / "training_metadata.json").read_text() == "epoch 2"
    assert (folder / "latest.weights.h5.bkp").read_text() == "epoch 1"
    assert all(Path(d).parent == folder and Path(d) != folder for d in written)
    assert sorted(p.name for p in folder.iterdir()) == [
        "latest.weights.h5", "latest.weights.h5.bkp", "training_metadata.json",
        "training_metadata.json.bkp"]  # no scratch folder left
