"""`mgpu-launch export`: the Slurm script's TF_CONFIG logic and the TFJob manifest.

The Slurm batch script runs mgpu-launch itself with `transport: slurm`: here
its YAML is checked to give the launcher's plan inside an allocation (sbatch on
a real Slurm cluster is tests/test_slurm.py). The TFJob manifest is
checked against the fields and types of the kubeflow.org/v1 TFJob API.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from launcher.job.config import ConfigError, load_config
from launcher.job.slurm import (
    Allocation,
    SlurmError,
    expand_hostlist,
    read_allocation,
    with_allocation,
)
from tests.conftest import run_cli

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
    assert [t["tf_config"] for t in got["tasks"]] == [t["tf_config"] for t in planned["tasks"]]
    assert got["tasks"][3]["tf_config"]["cluster"]["worker"] == [
        "node01:23456", "node01:23457", "node02:23458", "node02:23459"]
    for mine, theirs in zip(got["tasks"], planned["tasks"], strict=True):
        assert mine["env"] == theirs["env"]


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

# Fields and types of kubeflow.org/v1 TFJob as defined by the training operator
# (pkg/apis/kubeflow.org/v1/tensorflow_types.go and common_types.go), plus the
# parts of the core PodTemplateSpec we write. A key not listed is an error.
INT, STR = int, str
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}
REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
CONTAINER = {"name": STR, "image": STR, "command": [STR], "args": [STR], "workingDir": STR,
             "env": [{"name": STR, "value": STR}],
             "resources": {"limits": {"*": (INT, STR)}, "requests": {"*": (INT, STR)}},
             "volumeMounts": [{"name": STR, "mountPath": STR}],
             "ports": [{"name": STR, "containerPort": INT}]}
REPLICA_SPEC = {
    "replicas": INT,
    "restartPolicy": RESTART_POLICIES,
    "template": {"metadata": {"labels": {"*": STR}},
                 "spec": {"containers": [CONTAINER],
                          "volumes": [{"name": STR,
                                       "persistentVolumeClaim": {"claimName": STR}}]}},
}
TFJOB = {
    "apiVersion": {"kubeflow.org/v1"},
    "kind": {"TFJob"},
    "metadata": {"name": STR, "namespace": STR, "labels": {"*": STR}},
    "spec": {
        "runPolicy": {"cleanPodPolicy": CLEAN_POD_POLICIES, "ttlSecondsAfterFinished": INT,
                      "activeDeadlineSeconds": INT, "backoffLimit": INT},
        "successPolicy": {"", "AllWorkers"},
        "enableDynamicWorker": bool,
        "tfReplicaSpecs": {"*": REPLICA_SPEC},
    },
}
REQUIRED = {("spec", "tfReplicaSpecs"), ("apiVersion",), ("kind",), ("metadata", "name")}


def _check(value, schema, path="") -> list[str]:
    if isinstance(schema, set):
        return [] if value in schema else [f"{path}: {value!r} not one of {sorted(schema)}"]
    if isinstance(schema, list):
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [e for i, item in enumerate(value) for e in _check(item, schema[0], f"{path}[{i}]")]
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping"]
        errors = []
        for key, item in value.items():
            sub = schema.get(key, schema.get("*"))
            if sub is None:
                errors.append(f"{path}.{key}: not a field of the TFJob API")
            else:
                errors += _check(item, sub, f"{path}.{key}")
        return errors
    if schema is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a boolean"]
    types = schema if isinstance(schema, tuple) else (schema,)
    ok = isinstance(value, types) and not isinstance(value, bool)
    return [] if ok else [f"{path}: expected {schema}, got {value!r}"]


def _validate_tfjob(manifest: dict) -> None:
    errors = _check(manifest, TFJOB)
    for path in REQUIRED:
        node = manifest
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        if node is None:
            errors.append(f"{'.'.join(path)}: required")
    name = manifest["metadata"]["name"]
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label")
    for kind, spec in manifest["spec"]["tfReplicaSpecs"].items():
        if kind not in REPLICA_TYPES:
            errors.append(f"tfReplicaSpecs.{kind}: unknown replica type")
        containers = spec["template"]["spec"]["containers"]
        if not any(c["name"] == "tensorflow" and c.get("image") for c in containers):
            errors.append(f"tfReplicaSpecs.{kind}: needs a container 'tensorflow' with an image")
    assert not errors, "\n".join(errors)


def test_tfjob_for_chief_workers_and_ps(tmp_path: Path):
    # chief + 2 workers + 1 ps, as the issue asks.
    text = PARAMETER_SERVER.replace("  - address: node03\n    roles: {worker: 1}\n", "")
    text = text.replace("roles: {worker: 1}", "roles: {worker: 2}")
    cluster = _write(tmp_path, "ps.yaml", text)
    out = tmp_path / "job.yaml"
    done = run_cli(["export", "--to", "tfjob", "-o", str(out), "--image", "reg/img:1",
                    "--pvc", "shared-ckpt", str(cluster), "train.py", "--epochs", "3"],
                   cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "&id" not in out.read_text()  # no YAML anchors in a file people edit
    manifest = yaml.safe_load(out.read_text())
    _validate_tfjob(manifest)
    specs = manifest["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 1}
    assert {v["restartPolicy"] for v in specs.values()} == {"OnFailure"}
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 3
    assert manifest["metadata"]["name"] == "ps-job"
    for kind, spec in specs.items():
        container = spec["template"]["spec"]["containers"][0]
        assert container["command"] == ["python3.11", "train.py", "--epochs", "3"]
        assert container["image"] == "reg/img:1"
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
        assert env["MGPU_CHECKPOINT_DIR"] == "/shared/ckpt/ps"
        assert env["MGPU_STRATEGY"] == "parameter_server"
        assert env["MGPU_TASK_TYPE"] == kind.lower()
        assert "TF_CONFIG" not in env  # the operator sets it
        assert container["volumeMounts"] == [{"name": "checkpoints",
                                              "mountPath": "/shared/ckpt/ps"}]


@pytest.mark.parametrize("max_restarts, policy", [(0, "Never"), (5, "OnFailure")])
def test_tfjob_restart_policy_and_gpus(tmp_path: Path, max_restarts: int, policy: str):
    cluster = _write(tmp_path, "c.yaml", TWO_BY_TWO.replace(
        "max_restarts: 2", f"max_restarts: {max_restarts}").replace(
        "address: node01\n", "address: node01\n    gpus: [0, 1]\n"))
    done = run_cli(["export", "--to", "tfjob", str(cluster), "train.py"], cwd=tmp_path,
                   timeout=60)
    assert done.returncode == 0, done.stderr
    manifest = yaml.safe_load(done.stdout)
    _validate_tfjob(manifest)
    (kind, spec), = manifest["spec"]["tfReplicaSpecs"].items()
    assert kind == "Worker" and spec["replicas"] == 4 and spec["restartPolicy"] == policy
    container = spec["template"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert container["image"] == "mgpu-launch-worker:latest"


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
