"""Unit tests of the plan: tasks, ports, golden TF_CONFIG and MGPU_* variables."""

import json
import re
from pathlib import Path

import pytest

from launcher.spec.config import parse_config
from launcher.spec.plan import SERVER_COMMAND, build_plan
from launcher.spec.planview import plan_json
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
    assert re.fullmatch(r"~/\.mgpu-launch/runs/r1-[0-9a-f]{8}/node2", env["MGPU_RUN_DIR"])
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
    # The cluster once; a task's TF_CONFIG is it merged with the task's own part.
    assert plan["tf_config"] == {"cluster": {"worker": ["node1:23456", "node2:23457"]}}
    assert {**plan["tf_config"], **plan["tasks"][1]["tf_config"]} == json.loads(
        plan_of(TWO_HOSTS).tasks[1].tf_config_json())
    assert plan["env"]["MGPU_NUM_WORKERS"] == "2" and "MGPU_NUM_WORKERS" not in plan[
        "tasks"][1]["env"] and plan["tasks"][1]["env"]["MGPU_TASK_INDEX"] == "1"
    text = run_cli(["--dry-run", "cluster.yaml", "train.py"], cwd=tmp_path, timeout=60)
    assert "node2/worker1  node2:23457" in text.stdout
    assert '  {"cluster": {"worker": ["node1:23456", "node2:23457"]}}\n' in text.stdout
    assert text.stdout.count('"node1:23456"') == 1  # the cluster once, not per task
    assert 'TF_CONFIG task: {"index": 1, "type": "worker"}' in text.stdout
    # One task whole, as the task gets it.
    one = run_cli(["--dry-run", "--task", "node2/worker1", "cluster.yaml", "train.py"],
                  cwd=tmp_path, timeout=60)
    assert ('TF_CONFIG: {"cluster": {"worker": ["node1:23456", "node2:23457"]}, '
            '"task": {"index": 1, "type": "worker"}}') in one.stdout, one.stdout
    assert "env:       MGPU_NUM_WORKERS=2" in one.stdout
    whole = json.loads(run_cli(["--dry-run", "--json", "--task", "node2/worker1",
                                "cluster.yaml", "train.py"], cwd=tmp_path, timeout=60).stdout)
    assert whole["tf_config"]["task"] == {"type": "worker", "index": 1}
    assert whole["env"]["MGPU_NUM_WORKERS"] == "2"
    wrong = run_cli(["--dry-run", "--task", "node9/worker0", "cluster.yaml", "train.py"],
                    cwd=tmp_path, timeout=60)
    assert wrong.returncode == 2 and "node1/worker0, node2/worker1" in wrong.stdout + wrong.stderr
    assert "Traceback" not in wrong.stderr


# ---------------------------------------------------------------- TF_CONFIG addresses

RULES_YAML = """\
name: addr
checkpoint: {dir: /shared/ckpt}
ssh: {config_file: SSH_CONFIG}
hosts:
  - {address: gpu1, tf_address: 10.9.0.1, network_interface: ib0}  # tf_address wins
  - {address: gpu2, network_interface: ib0}   # its own interface beats the top level
  - {address: gpu3}                            # HostName from the ssh config
  - {address: gpu4}                            # behind a bastion: still its own HostName
  - {address: node5}                           # not in the ssh config: the address
"""


def test_each_rule_in_its_order_and_the_ssh_config_read_as_the_connection_reads_it(
        tmp_path: Path):
    from launcher.spec.plan import host_targets
    from launcher.transport.resolve import tf_addresses
    from launcher.transport.ssh_connect import Connector

    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host gpu3\n  HostName 10.0.0.3\n"
                          "Host gpu4\n  HostName %h.fast.lab\n  ProxyJump bastion\n"
                          "Host bastion\n  HostName 192.0.2.1\n")
    ssh_config.chmod(0o600)
    text = RULES_YAML.replace("SSH_CONFIG", str(ssh_config))
    loaded = parse_config(text, base_dir=tmp_path)
    targets = host_targets(loaded.config, "python3", loaded.base_dir)
    got = tf_addresses(loaded, targets)
    assert {h: (tf.shown, tf.rule) for h, tf in got.items()} == {
        "gpu1": ("10.9.0.1", "tf_address"),
        "gpu2": ("<address of ib0 on gpu2>", "network_interface"),
        "gpu3": ("10.0.0.3", "ssh_config"),
        "gpu4": ("gpu4.fast.lab", "ssh_config"),
        "node5": ("node5", "address"),
    }
    # One resolver: the connection goes to the very names TF_CONFIG holds.
    connector = Connector(default_user="me")
    assert connector.endpoint(targets[2]).hostname == "10.0.0.3"
    assert connector.endpoint(targets[3]).hostname == "gpu4.fast.lab"
    assert connector.endpoint(targets[3]).proxy_jump == "bastion"
    # A top-level interface beats the ssh config, not a host's own choice.
    top = parse_config(text.replace("name: addr\n", "name: addr\nnetwork_interface: eth1\n"),
                       base_dir=tmp_path)
    got = tf_addresses(top, targets)
    assert [got[h].shown for h in ("gpu1", "gpu2", "gpu3", "node5")] == [
        "10.9.0.1", "<address of ib0 on gpu2>", "<address of eth1 on gpu3>",
        "<address of eth1 on node5>"]
    plan = build_plan(top, ["train.py"], run_dir="/runs/r1", addresses=got)
    assert plan.unresolved == ("gpu2", "gpu3", "gpu4", "node5")
    assert plan.tasks[0].tf_config["cluster"]["worker"][:3] == (
        "10.9.0.1:23456", "<address of ib0 on gpu2>:23457", "<address of eth1 on gpu3>:23458")
    hellos = {name: {"interfaces": {"lo": ["127.0.0.1"], "eth1": ["10.1.0.3"],
                                    "ib0": ["10.2.0.2", "10.2.9.9"]}} for name in got}
    known = tf_addresses(top, targets, hellos)
    assert (known["gpu2"].address, known["gpu3"].address) == ("10.2.0.2", "10.1.0.3")
    plan = build_plan(top, ["train.py"], run_dir="/runs/r1", addresses=known)
    assert plan.unresolved == ()
    assert [t.address_rule for t in plan.tasks][:3] == [
        "tf_address", "network_interface", "network_interface"]
    assert plan_json(plan)["hosts"][1]["tf_address"] == "10.2.0.2"


def test_a_missing_interface_names_the_host_the_interface_and_what_the_host_has():
    from launcher.spec.addresses import AddressError, choose, with_interfaces

    loaded = parse_config(TWO_HOSTS + "network_interface: eth1\n")
    planned = {h.address: choose(loaded.config, h) for h in loaded.config.hosts}
    hellos = {"node1": {"interfaces": {"lo": ["127.0.0.1"], "eth0": ["10.0.0.1"]}},
              "node2": {"interfaces": {"lo": ["127.0.0.1"], "eth1": []}}}
    with pytest.raises(AddressError) as info:
        with_interfaces(planned, hellos)
    assert info.value.problems == {
        "node1": "it has no network interface eth1 (the top-level network_interface); it has "
                 "lo (127.0.0.1), eth0 (10.0.0.1)",
        "node2": "its interface eth1 has no IPv4 address (is it up?); the host has "
                 "lo (127.0.0.1), eth1 (no IPv4)",
    }
