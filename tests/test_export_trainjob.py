"""`mgpu-launch export --to trainjob`: a Kubeflow Trainer v2 TrainingRuntime and TrainJob.

Checked against the real API models: those of `kubeflow-trainer-api` (PyPI, the
Trainer's own generated models, pinned in pyproject.toml), for the TrainJob, the
runtime and the JobSet the runtime's template becomes; a round trip through the
models must give the manifest back, so an unknown key (which the models drop) or a
wrong type fails. Then the pods are run for real: each index's start command, with
the environment Kubernetes gives a trainer pod (JOB_COMPLETION_INDEX, the pods' DNS
names mapped to loopback addresses in a private /etc/hosts), as subprocesses, until
two workers have trained the bundled example.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubeflow_trainer_api import models

from launcher import podstart
from tests.conftest import EXAMPLES, REPO, SCRIPTS, cli_env, run_cli
from tests.tfjob_schema import validate_network_policy

PINNED = "2.3.0"  # kubeflow-trainer-api, as pyproject.toml pins it

CLUSTER = """\
name: Digits_TJ
env: {HF_TOKEN: hf_not_in_the_manifest, TF_CPP_MIN_LOG_LEVEL: "2"}
hosts:
  - {address: node1, gpus: [0]}
  - {address: node2, gpus: [0]}
checkpoint:
  dir: /shared/ckpt/digits
restart:
  max_restarts: 2
"""


def export(tmp_path: Path, cluster: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "cluster.yaml").write_text(cluster)
    return run_cli(["export", "--to", "trainjob", *extra, "cluster.yaml", "train.py",
                    "--epochs", "2"], tmp_path, timeout=60)


def strict(model: type, data: dict) -> object:
    """The manifest as the model reads it; what the model drops or changes fails."""
    obj = model.from_dict(data)
    assert obj.to_dict() == data, f"{model.__name__} does not read the manifest as written"
    return obj


def test_manifests_are_valid_trainer_v2_and_jobset_objects(tmp_path: Path) -> None:
    from importlib.metadata import version

    assert version("kubeflow-trainer-api") == PINNED
    result = export(tmp_path, CLUSTER, "--pvc", "shared-ckpt", "--namespace", "ml")
    assert result.returncode == 0, result.stderr
    assert "hf_not_in_the_manifest" not in result.stdout  # the secret is masked
    assert "kubectl create secret generic digits-tj-env -n ml --from-literal=HF_TOKEN=..." \
        in result.stderr
    runtime, trainjob, policy = list(yaml.safe_load_all(result.stdout))
    strict(models.TrainerV1alpha1TrainingRuntime, runtime)
    job = strict(models.TrainerV1alpha1TrainJob, trainjob)
    jobset = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
              "metadata": {"name": "digits-tj"}, "spec": runtime["spec"]["template"]["spec"]}
    js = strict(models.JobsetV1alpha2JobSet, jobset).spec
    # The plain-ML runtime: an mlPolicy with no framework.
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2}
    assert js.network.enable_dns_hostnames is True
    assert js.failure_policy.max_restarts == 2
    [node] = js.replicated_jobs
    assert node.name == "node" and node.template.spec.backoff_limit == 0
    pod = node.template.spec.template.spec
    assert pod.restart_policy == "Never"
    [container] = pod.containers
    assert container.name == "node"
    env = {e.name: e for e in container.env}
    assert json.loads(env["MGPU_TF_CLUSTER"].value) == {
        "worker": ["digits-tj-node-0-0.digits-tj:23456", "digits-tj-node-0-1.digits-tj:23457"]}
    assert env["HF_TOKEN"].value_from.secret_key_ref.name == "digits-tj-env"
    assert env["MGPU_CHECKPOINT_DIR"].value == "/shared/ckpt/digits"
    assert container.volume_mounts[0].mount_path == "/shared/ckpt/digits"
    assert pod.volumes[0].persistent_volume_claim.claim_name == "shared-ckpt"
    assert job.spec.runtime_ref.name == runtime["metadata"]["name"]
    assert job.spec.runtime_ref.kind == "TrainingRuntime"
    assert job.spec.trainer.num_nodes == 2
    assert job.spec.trainer.command[:3] == ["python3", "-m", "launcher.podstart"]
    assert trainjob["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert trainjob["metadata"]["namespace"] == runtime["metadata"]["namespace"] == "ml"
    # A task's exception: the bootstrap's record in the pod's termination message.
    assert env["MGPU_ERROR_FILE"].value == container.termination_message_path
    # The TF ports sealed to the job's own pods (security.tf_ports), every other port open.
    validate_network_policy(policy)
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"jobset.sigs.k8s.io/jobset-name": "digits-tj"}}
    assert policy["spec"]["ingress"][0]["ports"] == [
        {"protocol": "TCP", "port": 23456, "endPort": 23457}]
    assert "NetworkPolicy digits-tj-tf-ports admits only this job's pods" in result.stdout


def test_cluster_runtime_and_keras_distribution(tmp_path: Path) -> None:
    result = export(tmp_path, CLUSTER + "strategy: keras_distribution\nkeras: jax\n"
                    "security: {tf_ports: open}\n",
                    "--runtime-kind", "ClusterTrainingRuntime", "--namespace", "ml")
    assert result.returncode == 0, result.stderr
    assert "warning: no --pvc" in result.stderr
    runtime, trainjob = list(yaml.safe_load_all(result.stdout))  # tf_ports open: no policy
    strict(models.TrainerV1alpha1ClusterTrainingRuntime, runtime)
    strict(models.TrainerV1alpha1TrainJob, trainjob)
    assert "namespace" not in runtime["metadata"]  # cluster-scoped
    assert trainjob["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 2, "jax": {}}  # Trainer's JAX plugin


@pytest.mark.parametrize("cluster, words", [
    ("name: ps\nstrategy: parameter_server\nhosts:\n  - {address: a, roles: {chief: 1}}\n"
     "  - {address: b, roles: {ps: 1}}\n  - {address: c}\n", "export it with --to tfjob"),
    ("name: ev\nhosts:\n  - {address: a}\n  - {address: b, roles: {evaluator: 1}}\n",
     "an evaluator task"),
    ("name: two\nhosts:\n  - {address: a, roles: {worker: 2}}\n", "a trainer pod runs one"),
])
def test_what_does_not_map_is_refused_with_the_reason(tmp_path: Path, cluster: str,
                                                       words: str) -> None:
    result = export(tmp_path, cluster + "checkpoint: {dir: /shared/ckpt}\n")
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr


def test_pod_start_refuses_an_environment_that_is_not_a_pod_of_the_job() -> None:
    cluster = json.dumps({"chief": ["j-node-0-0.j:1"], "worker": ["j-node-0-1.j:2"]})
    base = {podstart.CLUSTER_ENV: cluster}
    env = podstart.task_env({**base, "JOB_COMPLETION_INDEX": "1"})
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    assert env["MGPU_GENERATION"] == "0" and env["MGPU_HOST"] == "j-node-0-1.j"
    chief = podstart.task_env({**base, "JOB_COMPLETION_INDEX": "0",
                               podstart.RESTART_ENV: "3", "MGPU_STRATEGY":
                               "keras_distribution", "JAX_NUM_PROCESSES": "2",
                               "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": "j:5"})
    assert chief["MGPU_TASK_TYPE"] == "chief" and chief["MGPU_GENERATION"] == "3"
    assert chief["KERAS_DISTRIBUTION_JOB_ADDRESSES"] == "j:5"
    for bad, words in (({"JOB_COMPLETION_INDEX": "2"}, "numNodes must be 2"),
                       ({}, "not a pod of an Indexed Job")):
        with pytest.raises(podstart.PodStartError, match=words):
            podstart.task_env({**base, **bad})
    result = subprocess.run([sys.executable, "-m", "launcher.podstart", "train.py"],
                            env=cli_env(JOB_COMPLETION_INDEX="0"), capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2 and "MGPU_TF_CLUSTER is not set" in result.stderr


def _container_env(runtime: dict) -> dict[str, str]:
    """The `node` container's plain env, as the kubelet would set it."""
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    [container] = job["template"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


# The bundled example (runtime calls, saves the model), and TensorFlow's multi-worker
# tutorial as people bring it (reads TF_CONFIG itself, its own BackupAndRestore dir).
PODS = {
    "example": ([str(EXAMPLES / "digits" / "train.py"), "--epochs", "2", "--save",
                 "model.keras"], "test accuracy"),
    "tutorial": ([str(SCRIPTS / "tutorial_mwms.py"), "tutorial-ckpt"], "WEIGHTS_CHECKSUM"),
}


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a private /etc/hosts per pod needs root and unshare")
@pytest.mark.parametrize("script", sorted(PODS))
def test_pods_train_from_the_exported_trainjob(tmp_path: Path, script: str) -> None:
    """Each pod: its own mount namespace, /etc/hosts naming both pods' DNS names
    (127.0.0.2, 127.0.0.3), the runtime's env and the TrainJob's command."""
    cluster = ("name: tj\nhosts:\n  - {address: node1}\n  - {address: node2}\n"
               f"checkpoint: {{dir: {tmp_path / 'ckpt'}}}\nports: {{base: 24561}}\n")
    (tmp_path / "cluster.yaml").write_text(cluster)
    argv, last_words = PODS[script]
    result = run_cli(["export", "--to", "trainjob", "cluster.yaml", *argv], tmp_path,
                     timeout=60)
    assert result.returncode == 0, result.stderr
    runtime, trainjob, _policy = list(yaml.safe_load_all(result.stdout))
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n" + "".join(
        f"127.0.0.{2 + i} tj-node-0-{i}.tj tj-node-0-{i}\n" for i in range(2)))
    command = trainjob["spec"]["trainer"]["command"]
    assert command[0] == "python3"
    pods = []
    for index in range(trainjob["spec"]["trainer"]["numNodes"]):
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(REPO),
               "HOSTNAME": f"tj-node-0-{index}", "JOB_COMPLETION_INDEX": str(index),
               **_container_env(runtime),
               # The kubelet's /dev/termination-log, one per pod.
               "MGPU_ERROR_FILE": str(tmp_path / f"termination-log-{index}")}
        shell = (f"mount --bind {hosts} /etc/hosts && exec {sys.executable} "
                 + " ".join(f"'{a}'" for a in command[1:]))
        log = (tmp_path / f"pod{index}.log").open("w")
        pods.append(subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                      "sh", "-c", shell], env=env, cwd=tmp_path,
                                     stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 180
    try:
        for pod in pods:
            pod.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
    logs = [(tmp_path / f"pod{i}.log").read_text() for i in range(2)]
    assert [p.returncode for p in pods] == [0, 0], "\n".join(log[-3000:] for log in logs)
    assert "tj-node-0-0.tj is worker 0 (generation 0)" in logs[0]
    assert "tj-node-0-1.tj is worker 1" in logs[1]
    assert all(last_words in log for log in logs), logs[0][-2000:]
    if script == "example":
        assert (tmp_path / "model.keras").exists()  # the chief saved the trained model
    else:  # both workers trained together: the same weights
        sums = [re.findall(r"WEIGHTS_CHECKSUM ([0-9.]+)", log) for log in logs]
        assert sums[0] == sums[1] and len(sums[0]) == 1, sums
