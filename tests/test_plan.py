"""Unit tests of the plan: tasks, ports, golden TF_CONFIG and MGPU_* variables."""

import json
from pathlib import Path

from launcher.job.config import parse_config
from launcher.job.plan import SERVER_COMMAND, build_plan
from tests.conftest import run_cli


def plan_of(yaml_text: str, **kwargs):
    loaded = parse_config(yaml_text, base_dir=Path("/proj"))
    return build_plan(loaded, ["train.py", "--epochs", "2"], run_dir="/runs/r1",
                      launch_cwd="/proj", **kwargs)


TWO_HOSTS = """\
name: digits
transport: ssh
checkpoint: {dir: /shared/ckpt}
hosts:
  - {address: node1}
  - {address: node2}
"""


def test_mwms_two_hosts_golden_tf_config():
    plan = plan_of(TWO_HOSTS)
    assert [t.label for t in plan.tasks] == ["node1/worker0", "node2/worker1"]
    assert [json.loads(t.tf_config_json()) for t in plan.tasks] == [
        {"cluster": {"worker": ["node1:23456", "node2:23457"]},
         "task": {"type": "worker", "index": 0}},
        {"cluster": {"worker": ["node1:23456", "node2:23457"]},
         "task": {"type": "worker", "index": 1}},
    ]
    env = plan.tasks[1].env
    assert env["MGPU_TASK_TYPE"] == "worker" and env["MGPU_TASK_INDEX"] == "1"
    assert env["MGPU_NUM_WORKERS"] == "2" and env["MGPU_GENERATION"] == "0"
    assert env["MGPU_CHECKPOINT_DIR"] == "/shared/ckpt"
    assert env["MGPU_RUN_DIR"] == "~/.mgpu-launch/runs/r1/node2"
    assert "TF_CONFIG" not in env  # travels to the agent's file, never via argv
    assert plan.tasks[0].argv == ("python3", "-m", "launcher.bootstrap", "train.py",
                                  "--epochs", "2")
    assert plan.tasks[0].cwd == "/proj"


def test_generation_and_ports_are_inputs():
    plan = plan_of(TWO_HOSTS, generation=3, ports=[40001, 40002])
    assert plan.tasks[0].env["MGPU_GENERATION"] == "3"
    assert plan.tasks[1].tf_config["cluster"]["worker"] == ("node1:40001", "node2:40002")


def test_repeated_address_gets_distinct_ports_and_chief_first():
    plan = plan_of("""\
transport: local
ports: {base: 23456}    # simulated hosts default to auto
hosts:
  - {address: 127.0.0.1, name: a, roles: {worker: 2}}
  - {address: 127.0.0.1, name: b, roles: {chief: 1, worker: 1}}
""")
    assert [t.label for t in plan.tasks] == ["b/chief0", "a/worker0", "a/worker1", "b/worker2"]
    ports = [t.port for t in plan.tasks]
    assert len(set(ports)) == 4
    assert plan.tasks[1].tf_config_json() == json.dumps({
        "cluster": {"chief": ["127.0.0.1:23456"],
                    "worker": ["127.0.0.1:23457", "127.0.0.1:23458", "127.0.0.1:23459"]},
        "task": {"index": 0, "type": "worker"}}, sort_keys=True)
    assert plan.tasks[0].env["MGPU_NUM_WORKERS"] == "4"
    # Simulated hosts keep their files inside the run directory.
    assert plan.tasks[0].env["MGPU_RUN_DIR"] == "/runs/r1/hosts/b"
    # Default checkpoint directory: stable across runs, beside the YAML.
    assert plan.checkpoint_dir == "/proj/checkpoints/job"


def test_parameter_server_servers_and_evaluator_outside_cluster():
    plan = plan_of("""\
strategy: parameter_server
transport: local
ports: {base: 23456}    # simulated hosts default to auto
hosts:
  - {address: 127.0.0.1, name: c, roles: {chief: 1, evaluator: 1}}
  - {address: 127.0.0.1, name: w, roles: {worker: 2, ps: 1}}
""")
    by_name = {t.name: t for t in plan.tasks}
    assert list(by_name) == ["chief0", "worker0", "worker1", "ps0", "evaluator0"]
    assert dict(by_name["evaluator0"].tf_config["cluster"]) == {
        "chief": ("127.0.0.1:23456",),
        "worker": ("127.0.0.1:23457", "127.0.0.1:23458"),
        "ps": ("127.0.0.1:23459",),
    }
    assert by_name["evaluator0"].port is None
    assert by_name["chief0"].argv[-3:] == ("train.py", "--epochs", "2")
    assert by_name["worker1"].command == SERVER_COMMAND
    assert by_name["ps0"].lifetime == "service" and by_name["chief0"].lifetime == "job"
    assert by_name["evaluator0"].lifetime == "service"  # stopped once training is over
    assert all(t.env["GRPC_FAIL_FAST"] == "use_caller" for t in plan.tasks)


def test_legacy_server_runs_the_script_everywhere_and_ps_is_a_service():
    plan = plan_of("""\
strategy: legacy_server
transport: local
ports: {base: 23456}    # simulated hosts default to auto
hosts:
  - {address: 127.0.0.1, name: a, roles: {worker: 2}}
  - {address: 127.0.0.1, name: b, roles: {ps: 1}}
""")
    assert [(t.name, t.lifetime) for t in plan.tasks] == [
        ("worker0", "job"), ("worker1", "job"), ("ps0", "service")]
    assert all(t.command[0] == "train.py" for t in plan.tasks)


def test_gpus_and_one_worker_per_gpu():
    plan = plan_of("""\
transport: local
ports: {base: 23456}    # simulated hosts default to auto
hosts:
  - {address: 127.0.0.1, name: a, gpus: [0, 1]}
  - {address: 127.0.0.1, name: b, gpus: [2, 3], tasks_per_host: per_gpu}
""")
    assert [(t.label, t.env["CUDA_VISIBLE_DEVICES"]) for t in plan.tasks] == [
        ("a/worker0", "0,1"), ("b/worker1", "2"), ("b/worker2", "3")]


def test_keras_flavour_sets_tf_use_legacy_keras():
    # auto: TensorFlow's own default (or the script's, or `env:`), never forced.
    assert "TF_USE_LEGACY_KERAS" not in plan_of(TWO_HOSTS).tasks[0].env
    assert plan_of(TWO_HOSTS + "keras: tf_keras\n").tasks[0].env["TF_USE_LEGACY_KERAS"] == "1"
    assert plan_of(TWO_HOSTS + "env: {TF_USE_LEGACY_KERAS: '1'}\n").tasks[0].env[
        "TF_USE_LEGACY_KERAS"] == "1"
    keras3 = plan_of(TWO_HOSTS + "keras: keras3\n")
    assert keras3.tasks[0].env["TF_USE_LEGACY_KERAS"] == "0"
    assert keras3.tasks[0].env["MGPU_KERAS"] == "keras3"


def test_dry_run_json_prints_the_plan_and_starts_nothing(tmp_path: Path):
    (tmp_path / "cluster.yaml").write_text(TWO_HOSTS)
    result = run_cli(["--dry-run", "--json", "cluster.yaml", "train.py"], cwd=tmp_path,
                     timeout=60)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [t["tf_config"]["task"] for t in plan["tasks"]] == [
        {"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
    assert plan["tasks"][0]["command"] == "python3 -m launcher.bootstrap train.py"
    assert not (tmp_path / "runs").exists()
    text = run_cli(["--dry-run", "cluster.yaml", "train.py"], cwd=tmp_path, timeout=60)
    assert "node2/worker1  node2:23457" in text.stdout
    assert 'TF_CONFIG: {"cluster": {"worker": ["node1:23456", "node2:23457"]}' in text.stdout
