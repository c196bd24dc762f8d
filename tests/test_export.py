"""`mgpu-launch export`: the Slurm script's TF_CONFIG logic and the TFJob manifest.

The Slurm side is checked by running the generated script's own code with the
environment Slurm sets for each task of an allocation (no Slurm here), and the
whole batch script under bash with a stand-in `srun` that starts the tasks as
Slurm would (same variables, one process per task). The TFJob manifest is
checked against the fields and types of the kubeflow.org/v1 TFJob API.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher.export import expand_hostlist
from tests.conftest import cli_env, run_cli

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


def _slurm_env(task: int, nodelist: str, nodes: list[str], per_node: int, **extra: str
               ) -> dict[str, str]:
    """What Slurm sets for task `task` of a block-distributed step (the ones we read)."""
    node = task // per_node
    return {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodelist, "SLURM_STEP_NODELIST": nodelist,
        "SLURM_NNODES": str(len(nodes)), "SLURM_NTASKS": str(len(nodes) * per_node),
        "SLURM_NTASKS_PER_NODE": str(per_node), "SLURM_PROCID": str(task),
        "SLURM_NODEID": str(node), "SLURM_LOCALID": str(task % per_node),
        "SLURMD_NODENAME": nodes[node], **extra,
    }


def _task_program(script: str) -> str:
    match = re.search(r"<<'MGPU_TASK_PY'\n(.*?)\nMGPU_TASK_PY\n", script, re.S)
    assert match, "the batch script embeds the task program in a quoted heredoc"
    return match.group(1)


def test_hostlist_expansion():
    assert expand_hostlist("node[01-02],gpu3") == ["node01", "node02", "gpu3"]
    assert expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert expand_hostlist("rack[1-2]-n[1,3]") == ["rack1-n1", "rack1-n3", "rack2-n1",
                                                   "rack2-n3"]
    assert expand_hostlist("a,b[001-002,7]") == ["a", "b001", "b002", "b7"]
    assert expand_hostlist("10.0.0.1") == ["10.0.0.1"]


def test_slurm_tf_config_matches_the_dry_run(tmp_path: Path):
    cluster = _write(tmp_path, "cluster.yaml", TWO_BY_TWO)
    dry = run_cli(["--dry-run", "--json", str(cluster), "train.py"], cwd=tmp_path, timeout=60)
    assert dry.returncode == 0, dry.stderr
    planned = {(t["tf_config"]["task"]["type"], t["tf_config"]["task"]["index"]): t
               for t in json.loads(dry.stdout)["tasks"]}

    exported = run_cli(["export", "--to", "slurm", str(cluster), "train.py"], cwd=tmp_path,
                       timeout=60)
    assert exported.returncode == 0, exported.stderr
    script = exported.stdout
    assert "#SBATCH --nodes=2\n" in script and "#SBATCH --ntasks-per-node=2\n" in script
    program = _task_program(script)

    seen = {}
    for task in range(4):  # 2 nodes x 2 tasks, as Slurm sets them on each task
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MGPU_SLURM_DRY_RUN": "1",
               **_slurm_env(task, "node[01-02]", ["node01", "node02"], 2)}
        done = subprocess.run([sys.executable, "-c", program, "train.py"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        setup = json.loads(done.stdout)
        kind = setup["tf_config"]["task"]
        seen[(kind["type"], kind["index"])] = setup
    assert seen.keys() == planned.keys()
    for key, setup in seen.items():
        plan_task = planned[key]
        assert setup["tf_config"] == plan_task["tf_config"], key
        # The same environment as under the launcher, but for the host-local paths.
        for name in ("MGPU_RUN_DIR",):
            setup["env"].pop(name), plan_task["env"].pop(name)
        assert setup["env"] == plan_task["env"], key
    assert seen[("worker", 3)]["tf_config"]["cluster"]["worker"] == [
        "node01:23456", "node01:23457", "node02:23458", "node02:23459"]


def test_slurm_batch_script_runs_the_tasks_and_restarts(tmp_path: Path):
    """The whole script under bash; `srun` is a stand-in that starts each task as Slurm would."""
    cluster = _write(tmp_path, "cluster.yaml", TWO_BY_TWO)
    out_file = tmp_path / "job.sbatch"
    exported = run_cli(["export", "--to", "slurm", "-o", str(out_file), str(cluster),
                        str(tmp_path / "train.py"), "--tag", "it's"], cwd=tmp_path, timeout=60)
    assert exported.returncode == 0, exported.stderr
    assert "sbatch" in exported.stderr and oct(out_file.stat().st_mode & 0o777) == "0o600"
    (tmp_path / "train.py").write_text(
        "import json, os, sys\n"
        "g, t = os.environ['MGPU_GENERATION'], os.environ['MGPU_TASK_TYPE'] + "
        "os.environ['MGPU_TASK_INDEX']\n"
        "out = os.path.join(os.environ['RESULTS'], f'{g}-{t}.json')\n"
        "json.dump({'tf_config': json.loads(os.environ['TF_CONFIG']), 'argv': sys.argv[1:],\n"
        "           'data_dir': os.environ['DATA_DIR']}, open(out, 'w'))\n"
        "sys.exit(1 if (g, t) == ('0', 'worker1') else 0)\n")
    env = _fake_slurm(tmp_path, "node[01-02]", 2, RESULTS=str(tmp_path / "results"))
    (tmp_path / "results").mkdir()
    done = subprocess.run(["bash", str(out_file)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "restart 1 of 2" in done.stderr
    assert "job succeeded (generation 1)" in done.stdout
    results = tmp_path / "results"
    files = sorted(p.name for p in results.iterdir())
    assert files == [f"{g}-worker{i}.json" for g in (0, 1) for i in range(4)]
    for i in range(4):
        record = json.loads((results / f"1-worker{i}.json").read_text())
        assert record["tf_config"]["task"] == {"type": "worker", "index": i}
        assert record["argv"] == ["--tag", "it's"]
        assert record["data_dir"] == "/data/digits set"


def _fake_slurm(tmp_path: Path, nodelist: str, per_node: int, **extra: str) -> dict[str, str]:
    """Environment of a batch job whose `srun` starts each task as Slurm would.

    The stand-in `srun` starts one process per task with Slurm's per-task
    variables and fails like `--kill-on-bad-exit` (the worst exit code wins).
    """
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "srun").write_text("""#!/bin/bash
while [[ "$1" == --* ]]; do shift; done
nodes=($(python3 -c 'import sys; from launcher.export import expand_hostlist as e; \
print(" ".join(e(sys.argv[1])))' "$SLURM_JOB_NODELIST"))
per_node=$SLURM_NTASKS_PER_NODE
pids=()
for n in "${!nodes[@]}"; do
  for ((l = 0; l < per_node; l++)); do
    SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST SLURM_NODEID=$n SLURM_LOCALID=$l \
    SLURM_PROCID=$((n * per_node + l)) SLURMD_NODENAME=${nodes[$n]} "$@" &
    pids+=($!)
  done
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
""")
    (shim / "srun").chmod(0o755)
    nodes = expand_hostlist(nodelist)
    # python3 on the "nodes" is this test's Python (TensorFlow's, in real life).
    path = os.pathsep.join([str(shim), str(Path(sys.executable).parent), os.environ["PATH"]])
    return cli_env(PATH=path, HOME=str(tmp_path), SLURM_JOB_ID="77",
                   SLURM_JOB_NODELIST=nodelist, SLURM_NNODES=str(len(nodes)),
                   SLURM_NTASKS=str(len(nodes) * per_node),
                   SLURM_NTASKS_PER_NODE=str(per_node), **extra)


def test_slurm_parameter_server_job_ends_when_the_chief_is_done(tmp_path: Path):
    """ps and workers never exit by themselves: the script stops them after the chief."""
    cluster = _write(tmp_path, "ps.yaml", PARAMETER_SERVER.replace(
        "python: python3.11", "python: python3").replace(
        "/shared/ckpt/ps", str(tmp_path / "ckpt")))
    out_file = tmp_path / "ps.sbatch"
    assert run_cli(["export", "--to", "slurm", "-o", str(out_file), str(cluster),
                    str(tmp_path / "train.py")], cwd=tmp_path, timeout=60).returncode == 0
    (tmp_path / "train.py").write_text(
        "import os, time\n"
        "me = os.environ['MGPU_TASK_TYPE'] + os.environ['MGPU_TASK_INDEX']\n"
        "up = os.path.join(os.environ['MGPU_CHECKPOINT_DIR'], 'up-')\n"
        "open(up + me, 'w').close()\n"
        "deadline = time.monotonic() + 60\n"
        "if me == 'chief0':\n"
        "    while time.monotonic() < deadline and not all(\n"
        "            os.path.exists(up + t) for t in ('ps0', 'worker0', 'worker1')):\n"
        "        time.sleep(0.05)\n"
        "    print('chief done', flush=True)\n"
        "else:\n"
        "    time.sleep(120)  # a server: runs until stopped\n")
    (tmp_path / "ckpt").mkdir()
    env = _fake_slurm(tmp_path, "node[01-03]", 2)
    done = subprocess.run(["bash", str(out_file)], env=env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chief done" in done.stdout and "job succeeded (generation 0)" in done.stdout
    assert (tmp_path / "ckpt" / ".mgpu-slurm" / "77-0.done").exists()


def test_slurm_uneven_hosts_leave_surplus_tasks_idle(tmp_path: Path):
    cluster = _write(tmp_path, "ps.yaml", PARAMETER_SERVER)
    script = run_cli(["export", "--to", "slurm", str(cluster), "train.py"], cwd=tmp_path,
                     timeout=60).stdout
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --ntasks-per-node=2\n" in script
    program = _task_program(script)
    nodes = ["node01", "node02", "node03"]
    got = []
    for task in range(6):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "MGPU_SLURM_DRY_RUN": "1",
               **_slurm_env(task, "node[01-03]", nodes, 2)}
        done = subprocess.run([sys.executable, "-c", program, "train.py"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        setup = json.loads(done.stdout)
        got.append(None if setup is None else setup["tf_config"]["task"])
    assert got == [{"type": "chief", "index": 0}, {"type": "ps", "index": 0},
                   {"type": "worker", "index": 0}, None, {"type": "worker", "index": 1}, None]


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
