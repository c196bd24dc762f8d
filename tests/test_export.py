"""`mgpu-launch export`: the Slurm script's TF_CONFIG logic and the TFJob manifest.

The Slurm batch script runs mgpu-launch itself with `transport: slurm`: here
its YAML is checked to give the launcher's plan inside an allocation (sbatch on
a real Slurm cluster is tests/test_slurm.py). The TFJob manifest is
checked against the training operator's published schema (tests/tfjob_schema.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from launcher.spec.allocation import Allocation, with_allocation
from launcher.spec.config import ConfigError, load_config
from launcher.spec.slurm import SlurmError, expand_hostlist, read_allocation
from launcher.tools.export import ExportError, render_tfjob, tfjob_manifest
from tests.conftest import run_cli
from tests.tfjob_schema import validate_network_policy, validate_tfjob

TWO_BY_TWO = """\
name: digits
checkpoint: {dir: CKPT}
env: {TF_CPP_MIN_LOG_LEVEL: "2", DATA_DIR: "/data/digits set"}
restart: {max_restarts: 2, backoff_s: 0}
ports: {base: 23456}
hosts:
  - address: node01
    roles: {worker: 2}
  - address: node02
    roles: {worker: 2}
"""

PARAMETER_SERVER = """\
name: ps_job
strategy: parameter_server
python: python3.11
checkpoint: {dir: /shared/ckpt/ps}
env: {TF_CPP_MIN_LOG_LEVEL: "2"}
restart: {max_restarts: 3}
hosts:
  - address: node01
    roles: {chief: 1, ps: 1}
  - address: node02
    roles: {worker: 1}
  - address: node03
    roles: {worker: 1}
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text.replace("CKPT", str(tmp_path / "ckpt")))
    return path


def _cluster_yaml(script: str) -> str:
    match = re.search(r"<<'MGPU_CLUSTER_YAML'\n(.*?)MGPU_CLUSTER_YAML\n", script, re.S)
    assert match, "the batch script hands the YAML to mgpu-launch in a quoted heredoc"
    return match.group(1)


def test_hostlist_expansion():
    assert expand_hostlist("node[01-02],gpu3") == ["node01", "node02", "gpu3"]
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_hostlist("rack[1-2]-n[1,3]") == ["rack1-n1", "rack1-n3", "rack2-n1",
                                                   "rack2-n3"]
    assert expand_hostlist("a,b[001-002,7]") == ["a", "b001", "b002", "b7"]
    assert expand_hostlist("10.0.0.1") == ["10.0.0.1"]


def test_slurm_script_runs_mgpu_launch_with_the_same_plan(tmp_path: Path):
    """The batch step is mgpu-launch with `transport: slurm`: inside an allocation
    of nodes node01, node02 its plan is the plan of the YAML (run for real on a
    Slurm cluster in tests/test_slurm.py)."""
    cluster = _write(tmp_path, "cluster.yaml", TWO_BY_TWO)
    same_run = ["--dry-run", "--json", "--run-dir", str(tmp_path / "run")]
    dry = run_cli([*same_run, str(cluster), "train.py"], cwd=tmp_path, timeout=60)
    assert dry.returncode == 0, dry.stderr
    planned = json.loads(dry.stdout)

    out_file = tmp_path / "job.sbatch"
    exported = run_cli(["export", "--to", "slurm", "-o", str(out_file), "--time", "1:00:00",
                        str(cluster), "train.py", "--tag", "it's"], cwd=tmp_path, timeout=60)
    assert exported.returncode == 0, exported.stderr
    assert "sbatch" in exported.stderr and oct(out_file.stat().st_mode & 0o777) == "0o600"
    script = out_file.read_text()
    for directive in ("--nodes=2", "--ntasks-per-node=1", "--requeue", "--signal=B:TERM@63",
                      "--time=1:00:00", "--job-name=digits"):
        assert f"#SBATCH {directive}\n" in script, directive
    assert re.search(r"^exec \S+ -m launcher --no-live /dev/fd/3 train.py --tag 'it'.*s' "
                     r"3<<'MGPU_CLUSTER_YAML'$", script, re.M), script
    assert "MGPU_TASK_PY" not in script  # no copy of the plan logic any more
    config = yaml.safe_load(_cluster_yaml(script))
    assert config["transport"] == "slurm"
    assert [h["address"] for h in config["hosts"]] == ["slurm:0", "slurm:1"]
    assert config["checkpoint"]["dir"] == str(tmp_path / "ckpt")

    # The same YAML inside an allocation: the launcher's plan, with the node names.
    (tmp_path / "slurm.yaml").write_text(_cluster_yaml(script))
    inside = run_cli([*same_run, str(tmp_path / "slurm.yaml"), "train.py"],
                     cwd=tmp_path, timeout=60, SLURM_JOB_ID="4242",
                     SLURM_JOB_NODELIST="node[01-02]")
    assert inside.returncode == 0, inside.stderr
    got = json.loads(inside.stdout)
    assert got["transport"] == "slurm"
    # Each task's TF_CONFIG and environment: the plan's shared part and the task's own.
    assert got["tf_config"] == planned["tf_config"] and got["env"] == planned["env"]
    assert [t["tf_config"] for t in got["tasks"]] == [t["tf_config"] for t in planned["tasks"]]
    assert got["tf_config"]["cluster"]["worker"] == [
        "node01:23456", "node01:23457", "node02:23458", "node02:23459"]
    for mine, theirs in zip(got["tasks"], planned["tasks"], strict=True):
        assert mine["env"] == theirs["env"]


def test_slurm_script_for_a_cluster_file_without_hosts(tmp_path: Path):
    """`transport: slurm` without hosts (every node of the allocation runs a
    worker): export asks for --nodes, then writes a script for that many nodes
    whose YAML still lists no hosts, so the launcher takes the allocation's."""
    cluster = _write(tmp_path, "slurm.yaml", "name: hostless\ntransport: slurm\n"
                     "checkpoint: {dir: CKPT}\n")
    missing = run_cli(["export", "--to", "slurm", str(cluster), "train.py"], cwd=tmp_path,
                      timeout=60)
    assert missing.returncode == 2, missing.stderr
    assert "--nodes" in missing.stderr and "Traceback" not in missing.stderr, missing.stderr

    out_file = tmp_path / "job.sbatch"
    exported = run_cli(["export", "--to", "slurm", "--nodes", "3", "--gpus-per-node", "2",
                        "-o", str(out_file), str(cluster), "train.py"], cwd=tmp_path, timeout=60)
    assert exported.returncode == 0, exported.stderr
    script = out_file.read_text()
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --gres=gpu:2\n" in script, script
    config = yaml.safe_load(_cluster_yaml(script))
    assert config["transport"] == "slurm" and config.get("hosts", []) == []

    # Inside a 3-node allocation the launcher plans one worker per node.
    (tmp_path / "inside.yaml").write_text(_cluster_yaml(script))
    inside = run_cli(["--dry-run", "--json", str(tmp_path / "inside.yaml"), "train.py"],
                     cwd=tmp_path, timeout=60, SLURM_JOB_ID="4243",
                     SLURM_JOB_NODELIST="gpu[1-3]")
    assert inside.returncode == 0, inside.stderr
    got = json.loads(inside.stdout)
    assert [t["host"] for t in got["tasks"]] == ["gpu1", "gpu2", "gpu3"]


def test_slurm_script_keeps_roles_and_spares(tmp_path: Path):
    cluster = _write(tmp_path, "ps.yaml", PARAMETER_SERVER.replace(
        "  - address: node03\n    roles: {worker: 1}\n",
        "  - address: node03\n    roles: {worker: 1}\n  - address: node04\n    spare: true\n"))
    done = run_cli(["export", "--to", "slurm", str(cluster), "train.py"], cwd=tmp_path,
                   timeout=60)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --nodes=4\n" in done.stdout  # the spare is a node of the allocation too
    hosts = yaml.safe_load(_cluster_yaml(done.stdout))["hosts"]
    assert hosts == [{"address": "slurm:0", "roles": {"chief": 1, "ps": 1}},
                     {"address": "slurm:1", "roles": {"worker": 1}},
                     {"address": "slurm:2", "roles": {"worker": 1}},
                     {"address": "slurm:3", "spare": True}]


# ------------------------------------------------------------------- TFJob
# Every manifest is validated against the training operator's published schema
# (the kubeflow-training SDK's models, tests/tfjob_schema.py).


def _tfjob(tmp_path: Path, text: str, *options: str) -> tuple[dict, str, str]:
    """(manifest, file text, stderr) of `export --to tfjob` for cluster YAML `text`."""
    cluster = _write(tmp_path, "cluster.yaml", text)
    out = tmp_path / "job.yaml"
    done = run_cli(["export", "--to", "tfjob", "-o", str(out), *options, str(cluster),
                    "train.py", "--epochs", "3"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert oct(out.stat().st_mode & 0o777) == "0o600"
    text = out.read_text()
    manifest, *rest = yaml.safe_load_all(text)
    validate_tfjob(manifest)
    for policy in rest:  # the TF port's NetworkPolicy (security.tf_ports)
        validate_network_policy(policy)
    return manifest, text, done.stderr


def _containers(manifest: dict) -> dict[str, dict]:
    return {kind: spec["template"]["spec"]["containers"][0]
            for kind, spec in manifest["spec"]["tfReplicaSpecs"].items()}


def test_tfjob_for_chief_workers_and_ps(tmp_path: Path):
    # chief + 2 workers + 1 ps, as the issue asks.
    text = PARAMETER_SERVER.replace("  - address: node03\n    roles: {worker: 1}\n", "")
    text = text.replace("roles: {worker: 1}", "roles: {worker: 2}")
    manifest, written, stderr = _tfjob(tmp_path, text, "--image", "reg/img:1",
                                       "--pvc", "shared-ckpt")
    assert "&id" not in written  # no YAML anchors in a file people edit
    assert "warning" not in stderr  # the checkpoint dir is on the PVC
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    assert {v["restartPolicy"] for v in specs.values()} == {"ExitCode"}
    assert manifest["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running"}
    # parameter_server: the default success policy, the chief (the coordinator) decides.
    assert "successPolicy" not in manifest["spec"]
    assert manifest["metadata"]["name"] == "ps-job"
    for kind, container in _containers(manifest).items():
        # The chief runs the script; workers and ps serve it, as in the launcher's plan.
        assert container["command"] == (["python3.11", "-m", "launcher.bootstrap", "train.py",
                                          "--epochs", "3"]
                                        if kind == "Chief" else
                                        ["python3.11", "-m", "launcher.runtime.server"])
        assert container["image"] == "reg/img:1"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert env["MGPU_CHECKPOINT_DIR"] == "/shared/ckpt/ps"
        assert env["MGPU_STRATEGY"] == "parameter_server"
        assert env["MGPU_TASK_TYPE"] == kind.lower()
        assert "TF_CONFIG" not in env  # the operator sets it
        assert container["volumeMounts"] == [{"name": "checkpoints",
                                              "mountPath": "/shared/ckpt/ps"}]
        assert specs[kind]["template"]["spec"]["volumes"] == [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}}]
    header = "".join(line for line in written.splitlines(True) if line.startswith("#"))
    assert "Succeeds when the chief has exited 0" in header
    assert "restartPolicy ExitCode, up to backoffLimit 3" in header
    assert "on PersistentVolumeClaim shared-ckpt" in header
    assert "--restart-policy OnFailure" not in header  # the MWMS hint


@pytest.mark.parametrize("max_restarts, option, policy", [
    (0, None, "Never"), (5, None, "ExitCode"), (5, "OnFailure", "OnFailure"),
    (5, "ExitCode", "ExitCode")])
def test_tfjob_restart_policy_and_gpus(tmp_path: Path, max_restarts: int, option: str | None,
                                       policy: str):
    text = TWO_BY_TWO.replace("max_restarts: 2", f"max_restarts: {max_restarts}").replace(
        "address: node01\n", "address: node01\n    gpus: [0, 1]\n")
    options = ["--restart-policy", option] if option else []
    manifest, written, stderr = _tfjob(tmp_path, text, *options)
    (kind, spec), = manifest["spec"]["tfReplicaSpecs"].items()
    assert kind == "Worker" and spec["replicas"] == 4 and spec["restartPolicy"] == policy
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == max_restarts
    # multi_worker_mirrored without a chief: done when every worker is, as the launcher.
    assert manifest["spec"]["successPolicy"] == "AllWorkers"
    assert "Succeeds when every worker has exited 0" in written
    container = spec["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"}}
    assert container["image"] == "mgpu-launch-worker:latest"
    assert container["command"] == ["python3", "-m", "launcher.bootstrap", "train.py",
                                    "--epochs", "3"]
    assert {"ExitCode": "exit 1-127 fails the job", "OnFailure": "any failure",
            "Never": "Restarts: none"}[policy] in written.replace("\n# ", " ")
    # A killed MWMS worker's peers fail with exit 1, permanent under ExitCode: said so.
    assert ("export with --restart-policy OnFailure" in written) == (policy == "ExitCode")
    # No --pvc: the checkpoint dir is each pod's own; said in the file and on stderr.
    assert "volumes" not in spec["template"]["spec"] and "volumeMounts" not in container
    assert "WARNING: checkpoints go to" in written
    assert "warning: no --pvc" in stderr


def test_tfjob_secret_env_comes_from_a_secret(tmp_path: Path):
    """Issue 14: secret-looking env values never appear in the manifest."""
    text = TWO_BY_TWO.replace('env: {', 'env: {HF_TOKEN: abc, WANDB_API_KEY: "k-9", ')
    manifest, written, stderr = _tfjob(tmp_path, text, "--namespace", "ml")
    assert "abc" not in written and "k-9" not in written and "abc" not in stderr
    env = {e["name"]: e for e in _containers(manifest)["Worker"]["env"]}
    for name in ("HF_TOKEN", "WANDB_API_KEY"):
        assert env[name] == {"name": name, "valueFrom": {"secretKeyRef": {
            "name": "digits-env", "key": name}}}
    assert env["DATA_DIR"] == {"name": "DATA_DIR", "value": "/data/digits set"}
    create = ("kubectl create secret generic digits-env -n ml "
              "--from-literal=HF_TOKEN=... --from-literal=WANDB_API_KEY=...")
    assert f"#   {create}\n" in written
    assert create in stderr


def test_tfjob_manifest_in_process(tmp_path: Path):
    """The library call: a name made a DNS-1035 label, a workdir, an unknown policy refused."""
    loaded = load_config(_write(tmp_path, "c.yaml", TWO_BY_TWO.replace(
        "name: digits", "name: 2_Digits.Run\nworkdir: /srv/train")))
    manifest = tfjob_manifest(loaded, ["train.py"], checkpoint_dir="/ckpt", pvc="p")
    validate_tfjob(manifest)
    assert manifest["metadata"]["name"] == "job-2-digits-run"
    container = _containers(manifest)["Worker"]
    assert container["workingDir"] == "/srv/train"
    assert {"name": "MGPU_CHECKPOINT_DIR", "value": "/ckpt"} in container["env"]
    assert "create secret" not in render_tfjob(manifest, "c.yaml")  # no Secret needed
    with pytest.raises(ExportError, match="restart policy 'Always'"):
        tfjob_manifest(loaded, ["train.py"], restart_policy="Always")


def test_export_usage_errors(tmp_path: Path):
    bad = _write(tmp_path, "bad.yaml", "hosts: []\n")
    done = run_cli(["export", "--to", "slurm", str(bad), "train.py"], cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "hosts" in done.stderr
    none = run_cli(["export", "--to", "tfjob", str(bad)], cwd=tmp_path, timeout=60)
    assert none.returncode == 2 and "no training script" in none.stderr


def test_allocation_gpus_and_node_positions(tmp_path: Path):
    """What `transport: slurm` reads from an allocation (the exported YAML's `slurm:N`)."""
    environ = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-2]", "SLURM_JOB_GPUS": "2,3"}
    allocation = read_allocation(environ, hostnames=lambda _: None)
    assert allocation == Allocation("7", ("gpu1", "gpu2"), (0, 1))
    assert read_allocation({**environ, "SLURM_GPUS_ON_NODE": "4"},
                           hostnames=lambda _: None).gpus == (0, 1, 2, 3)
    batch = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu1", "SLURMD_NODENAME": "gpu1",
             "CUDA_VISIBLE_DEVICES": "0,1,2"}
    assert read_allocation(batch, hostnames=lambda _: None).gpus == (0, 1, 2)
    loaded = load_config(_write(tmp_path, "c.yaml", "transport: slurm\nhosts:\n"
                                "  - {address: 'slurm:1', gpus: [0]}\n  - {address: 'slurm:0'}\n"))
    hosts = with_allocation(loaded, allocation, python="/venv/python").config.hosts
    assert [(h.address, h.gpus) for h in hosts] == [("gpu2", [0]), ("gpu1", [0, 1])]
    three = load_config(_write(tmp_path, "d.yaml", "transport: slurm\nhosts:\n" + "".join(
        f"  - {{address: 'slurm:{i}'}}\n" for i in range(3))))
    with pytest.raises(ConfigError, match=r"'slurm:2', but Slurm job 7 has 2 node\(s\)"):
        with_allocation(three, allocation)
    with pytest.raises(SlurmError, match="not inside a Slurm allocation"):
        read_allocation({})


def test_tfjob_comes_with_a_network_policy_admitting_only_its_pods_to_the_tf_port(
        tmp_path: Path):
    manifest, text, _ = _tfjob(tmp_path, TWO_BY_TWO.replace("CKPT", "/shared/ckpt"),
                               "--namespace", "ml")
    policy = list(yaml.safe_load_all(text))[1]
    job_pods = {"matchLabels": {"training.kubeflow.org/job-name": "digits"}}
    assert policy["metadata"] == {"name": "digits-tf-port", "namespace": "ml",
                                  "labels": manifest["metadata"]["labels"]}
    assert policy["spec"]["podSelector"] == job_pods
    tf_rule, other_ports = policy["spec"]["ingress"]
    assert tf_rule == {"from": [{"podSelector": job_pods}],
                       "ports": [{"protocol": "TCP", "port": 2222}]}
    # Every other port stays open to anyone: only the TF port is sealed.
    assert {"protocol": "TCP", "port": 1, "endPort": 2221} in other_ports["ports"]
    assert {"protocol": "TCP", "port": 2223, "endPort": 65535} in other_ports["ports"]
    assert "from" not in other_ports
    assert "# TF port: NetworkPolicy digits-tf-port admits only this job's pods" in text
    _, text, _ = _tfjob(tmp_path, TWO_BY_TWO.replace("CKPT", "/shared/ckpt")
                        + "security: {tf_ports: open}\n")
    assert "NetworkPolicy" not in text and len(list(yaml.safe_load_all(text))) == 1


def test_the_network_policy_check_catches_a_broken_policy():
    from tests.tfjob_schema import network_policy_errors

    errors = network_policy_errors({"apiVersion": "v1", "kind": "NetworkPolicy",
                                    "metadata": {"name": "Bad_Name"},
                                    "spec": {"ingress": [{"ports": [{"port": "x",
                                                                     "endPort": 9}]}],
                                             "podSelectors": {}}})
    assert any("apiVersion" in e for e in errors)
    assert any("metadata.name" in e for e in errors)
    assert any("spec.podSelectors: not a field of V1NetworkPolicySpec" in e for e in errors)
    assert any("endPort needs a numeric port" in e for e in errors)


@pytest.mark.parametrize("to", ["trainjob", "tfjob"])
def test_a_script_path_of_this_machine_is_warned_about(tmp_path: Path, to: str):
    # The pods run the script's path in their image: an absolute path that exists
    # here is there only if the image was made with it. Warned on stderr; stdout
    # is the manifest still. The image's own path and a relative one: no word.
    cluster = _write(tmp_path, "cluster.yaml", TWO_BY_TWO.replace("roles: {worker: 2}", ""))
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    done = run_cli(["export", "--to", to, "--pvc", "shared", "--image", "team/train:1",
                    str(cluster), str(script), "--epochs", "3"], cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"mgpu-launch export: warning: the pods run {script}, a path on this machine: it is "
        "there only if the image (team/train:1) holds the script at that path; copy it into "
        "the image and give its path in the image (absolute, or relative to the pods' working "
        "directory: an absolute `workdir:`, else the image's WORKDIR)"], done.stderr
    manifests = list(yaml.safe_load_all(done.stdout))
    assert manifests[0]["kind"] in ("TFJob", "TrainingRuntime")
    assert str(script) in done.stdout
    for given in ("/app/train.py", "train.py"):
        done = run_cli(["export", "--to", to, "--pvc", "shared", str(cluster), given],
                       cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr
