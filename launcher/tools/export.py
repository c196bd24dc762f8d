"""`mgpu-launch export --to slurm|tfjob CLUSTER.yaml SCRIPT [ARGS...]`: leave SSH behind.

Owns the translation of a cluster YAML into a Slurm batch script or a Kubeflow
`TFJob` manifest (kubeflow.org/v1), so a job that outgrew SSH moves to the
scheduler a company already runs, with the same roles, environment, restart
policy and TF_CONFIG layout.

The Slurm batch script runs mgpu-launch itself inside the allocation, with
the YAML turned into `transport: slurm` (launcher.spec.allocation), so a batch job gets
the launcher's own plan, supervision, restarts and run records.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from ..spec.allocation import Allocation, with_allocation
from ..spec.config import LoadedConfig
from ..spec.plan import (
    ROLE_ORDER,
    Plan,
    Task,
    build_plan,
    default_checkpoint_dir,
    ports_needed,
)
from ..spec.redact import looks_secret
from ..spec.slurm import NODE_BY_POSITION
from ..spec.transports import TransportName
from ..strategy import Strategy

DEFAULT_IMAGE = "mgpu-launch-worker:latest"  # built from docker/Dockerfile (README.md, Docker)
K8S_CHECKPOINT_ROOT = "/mnt/checkpoints"
# Environment the launcher sets per task; everything else in a task's env is shared.
_PER_TASK_ENV = ("MGPU_TASK_TYPE", "MGPU_TASK_INDEX", "MGPU_HOST", "MGPU_RUN_DIR",
                 "MGPU_GENERATION", "CUDA_VISIBLE_DEVICES")
# TFJob replica types (tensorflow_types.go) for our roles.
TFJOB_REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
TFJOB_CONTAINER = "tensorflow"  # the operator requires a container of this name


class ExportError(Exception):
    """The config cannot be expressed for the target scheduler."""


# ------------------------------------------------------------------ shared


def _plan(loaded: LoadedConfig, command: Sequence[str]) -> Plan:
    """The launcher's own plan (spare hosts left out): the source of roles and env."""
    return build_plan(loaded, command, run_dir="/unused",
                      ports=list(range(1, ports_needed(loaded.config) + 1)))


def shared_env(task: Task, checkpoint_dir: str | None = None) -> dict[str, str]:
    """The environment of `task` as the launcher builds it, less what is per task."""
    env = {k: v for k, v in task.env.items() if k not in _PER_TASK_ENV}
    if checkpoint_dir is not None:
        env["MGPU_CHECKPOINT_DIR"] = checkpoint_dir
    return env


def pod_gpus(tasks: Sequence[Task]) -> int:
    """GPUs one task of these needs (its CUDA_VISIBLE_DEVICES in the plan)."""
    return max((len(t.env["CUDA_VISIBLE_DEVICES"].split(",")) for t in tasks
                if t.env.get("CUDA_VISIBLE_DEVICES")), default=0)


# ------------------------------------------------------------------- Slurm

_SLURM_TEMPLATE = """\
#!/bin/bash
# Slurm batch script written by `mgpu-launch export --to slurm` from {source}.
# Submit with: sbatch {output_name}
#
# Its job step is mgpu-launch itself with `transport: slurm` (the cluster YAML is
# below): one agent per node through srun, the hosts of the YAML on the allocation's
# nodes in order (`address: slurm:N` is node N), and the same supervision, restarts
# (up to {max_restarts}), live output and run records (runs/) as over SSH.
# Requeued when preempted; {grace_s} s before the time limit Slurm sends SIGTERM to
# mgpu-launch, which stops the tasks (they checkpoint) and writes the run's summary.
# The next run resumes from the checkpoints in {checkpoint_dir}.
{directives}

set -eu
# exec: Slurm's signals reach mgpu-launch, not a waiting shell.
exec {python} -m launcher {launcher_options}/dev/fd/3 {command} 3<<'MGPU_CLUSTER_YAML'
{cluster_yaml}MGPU_CLUSTER_YAML
"""
# Seconds of warning before the time limit (`--signal=B:TERM@N`): the tasks'
# grace period plus time for the launcher to stop them and write its records.
SIGNAL_MARGIN_S = 60
# Host keys of the YAML that mean nothing inside an allocation.
_SSH_KEYS = ("user", "port", "identity_file", "known_hosts", "host_key_policy", "config_file",
             "connect_timeout_s")


def slurm_cluster_yaml(loaded: LoadedConfig, port_base: int | None = None) -> str:
    """The YAML the batch script hands to mgpu-launch: `transport: slurm`, host i
    on the allocation's node i, paths made absolute (the script may run elsewhere)."""
    config = loaded.config
    slurm = TransportName.SLURM.value
    data = {"transport": slurm, **config.model_dump(mode="json", exclude_unset=True)}
    data["transport"] = slurm
    data.pop("ssh", None)
    hosts = []
    for i, host in enumerate(data.get("hosts", [])):
        host = {k: v for k, v in host.items() if k not in _SSH_KEYS}
        host["address"] = f"{NODE_BY_POSITION}{i}"
        hosts.append(host)
    data["hosts"] = hosts
    data["checkpoint"] = {**data.get("checkpoint", {}), "dir": default_checkpoint_dir(loaded)}
    if config.workdir is not None:
        data["workdir"] = str(loaded.resolve_path(config.workdir))
    if port_base is not None:
        data["ports"] = {"base": port_base}
    text = yaml.safe_dump(data, sort_keys=False)
    if "MGPU_CLUSTER_YAML" in text:  # would end the script's heredoc early
        raise ExportError("the config contains the text MGPU_CLUSTER_YAML: rename what holds it")
    return text


def slurm_script(loaded: LoadedConfig, command: Sequence[str], *, port_base: int | None = None,
                 partition: str | None = None, time_limit: str | None = None,
                 output_name: str = "job.sbatch", python: str | None = None,
                 nodes: int | None = None, gpus_per_node: int | None = None) -> str:
    """`nodes`, `gpus_per_node`: the allocation to ask for when the cluster file
    lists no hosts (`transport: slurm`: every node of the allocation runs a worker)."""
    config = loaded.config
    planned = _allocation_config(loaded, nodes, gpus_per_node)
    _plan(planned, command)  # refuse a config the launcher could not plan
    gpus = max(len(h.gpus) for h in planned.config.hosts)
    directives = [f"#SBATCH --job-name={config.name}",
                  f"#SBATCH --nodes={len(planned.config.hosts)}",
                  # One launcher; the agents' steps overlap it and take whole nodes.
                  "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive",
                  f"#SBATCH --output={config.name}-%j.out", "#SBATCH --open-mode=append",
                  "#SBATCH --requeue",
                  f"#SBATCH --signal=B:TERM@{int(config.restart.grace_s) + SIGNAL_MARGIN_S}"]
    if gpus:
        directives.append(f"#SBATCH --gres=gpu:{gpus}")
    workdir = loaded.resolve_path(config.workdir)
    if workdir is not None:
        directives.append(f"#SBATCH --chdir={workdir}")
    if partition:
        directives.append(f"#SBATCH --partition={partition}")
    if time_limit:
        directives.append(f"#SBATCH --time={time_limit}")
    return _SLURM_TEMPLATE.format(
        source=loaded.source or "a generated config",
        output_name=output_name,
        max_restarts=config.restart.max_restarts,
        grace_s=int(config.restart.grace_s) + SIGNAL_MARGIN_S,
        checkpoint_dir=default_checkpoint_dir(loaded),
        directives="\n".join(directives),
        # The interpreter that has mgpu-launch; the nodes share it on a Slurm cluster.
        python=shlex.quote(python or sys.executable),
        launcher_options="--no-live ",  # the output goes to a file
        command=shlex.join(command),
        cluster_yaml=slurm_cluster_yaml(loaded, port_base),
    )


def _allocation_config(loaded: LoadedConfig, nodes: int | None,
                       gpus_per_node: int | None) -> LoadedConfig:
    """The config as it will run in the allocation: the hosts it lists, or, for
    one that lists none, `nodes` nodes with `gpus_per_node` GPUs each."""
    hosts = loaded.config.hosts
    if nodes is not None and nodes < 1:
        raise ExportError("--nodes needs a number of nodes >= 1")
    if gpus_per_node is not None and gpus_per_node < 0:
        raise ExportError("--gpus-per-node needs a number >= 0")
    if hosts:
        if nodes is not None and nodes != len(hosts):
            raise ExportError(f"--nodes {nodes}, but the cluster file lists {len(hosts)} "
                              "host(s), one node each: drop --nodes or the hosts")
        if gpus_per_node is not None:
            raise ExportError("--gpus-per-node is for a cluster file without hosts: "
                              "list each host's `gpus` instead")
        return loaded
    if nodes is None:
        raise ExportError("the cluster file lists no hosts (under `transport: slurm` every "
                          "node of the allocation runs a worker): give --nodes N, the nodes "
                          "to allocate (and --gpus-per-node G on GPU nodes)")
    allocation = Allocation(job_id="export", nodes=tuple(f"node{i}" for i in range(nodes)),
                            gpus=tuple(range(gpus_per_node or 0)))
    return with_allocation(loaded, allocation)


# ------------------------------------------------------------------- TFJob

# `restartPolicy` of every replica when restarts are allowed (max_restarts > 0).
# The operator's ExitCode policy reads the exit code of the `tensorflow` container:
# 128-255 (killed by a signal: 137 SIGKILL or the OOM killer, 143 SIGTERM, e.g. an
# eviction) is retryable, the pod is recreated; 1-127 is permanent, the job fails.
# So a Python exception (exit 1) fails the job at once instead of being retried
# in vain, and a kill is retried, up to runPolicy.backoffLimit (max_restarts).
# Exit 42 (the runtime's "restart me" after a save on SIGTERM) is in 1-127 too:
# permanent under ExitCode; and under multi_worker_mirrored the peers of a killed
# worker usually end with a TensorFlow error (a Python exception, exit 1), which
# fails the job. OnFailure (--restart-policy) restarts on any failure, as the
# launcher does over SSH.
TFJOB_RESTART_POLICIES = ("ExitCode", "OnFailure")
DEFAULT_TFJOB_RESTART_POLICY = "ExitCode"
CHECKPOINT_VOLUME = "checkpoints"
# The TF port the operator gives every replica when its container names none
# (tensorflow DefaultPort, port name tfjob-port), and the label it puts on
# every pod of a TFJob (the kubeflow-training SDK's JOB_NAME_LABEL).
TFJOB_PORT = 2222
TFJOB_NAME_LABEL = "training.kubeflow.org/job-name"


def dns_name(name: str) -> str:
    """A TFJob name must be a DNS-1035 label: lower case, digits and '-', a letter first."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"job-{label}".rstrip("-")
    return label[:63].rstrip("-")


def tfjob_secret_name(job_name: str) -> str:
    """The Secret that holds the secret-looking `env` values of TFJob `job_name`."""
    return f"{job_name}-env"


def env_var(name: str, value: str, secret: str) -> dict[str, Any]:
    """One container env entry: a secret-looking name (launcher.spec.redact) reads
    its value from key NAME of Secret `secret`, so the value is never written."""
    if looks_secret(name):
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": name}}}
    return {"name": name, "value": value}


def tfjob_manifest(loaded: LoadedConfig, command: Sequence[str], *, image: str = DEFAULT_IMAGE,
                   checkpoint_dir: str | None = None, pvc: str | None = None,
                   namespace: str | None = None,
                   restart_policy: str = DEFAULT_TFJOB_RESTART_POLICY) -> dict[str, Any]:
    """A kubeflow.org/v1 TFJob: one replica spec per role, counts summed over the hosts."""
    if restart_policy not in TFJOB_RESTART_POLICIES:
        raise ExportError(f"restart policy {restart_policy!r}: one of "
                          f"{', '.join(TFJOB_RESTART_POLICIES)}")
    config = loaded.config
    if checkpoint_dir is None:
        configured = config.checkpoint.dir
        checkpoint_dir = (configured if configured and configured.startswith("/")
                          else f"{K8S_CHECKPOINT_ROOT}/{config.name}")
    plan = _plan(loaded, command)
    name = dns_name(config.name)
    # max_restarts 0: no restart at all (the operator's default, Never).
    policy = restart_policy if config.restart.max_restarts > 0 else "Never"
    specs: dict[str, Any] = {}
    for role in ROLE_ORDER:
        tasks = [t for t in plan.tasks if t.role == role]
        if tasks:
            pod = _pod(loaded, role, tasks, image=image, checkpoint_dir=checkpoint_dir,
                       pvc=pvc, secret=tfjob_secret_name(name))
            specs[TFJOB_REPLICA_TYPES[role]] = {
                "replicas": len(tasks),
                "restartPolicy": policy,
                "template": {"spec": pod},
            }
    metadata: dict[str, Any] = {"name": name,
                                "labels": {"app.kubernetes.io/created-by": "mgpu-launch"}}
    if namespace:
        metadata["namespace"] = namespace
    return {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": metadata,
            "spec": _tfjob_spec(loaded, specs)}


def _pod(loaded: LoadedConfig, role: str, tasks: list[Task], *, image: str,
         checkpoint_dir: str, pvc: str | None, secret: str) -> dict[str, Any]:
    """The pod template of one role's replicas: its container, GPUs and checkpoint volume."""
    config = loaded.config
    gpus = pod_gpus(tasks)
    env = shared_env(tasks[0], checkpoint_dir=checkpoint_dir)
    # The plan's argv: the script under the launcher's bootstrap (the Keras 3 fixes,
    # the guards, `__main__` as by hand), or the launcher's TensorFlow server for
    # the workers and ps of a parameter_server job (they only serve the chief).
    argv = [config.python or "python3", *tasks[0].argv[1:]]
    container: dict[str, Any] = {
        "name": TFJOB_CONTAINER,
        "image": image,
        "command": argv,
        "env": [env_var(k, v, secret)
                for k, v in sorted({**env, "MGPU_TASK_TYPE": role}.items())],
    }
    if config.workdir and config.workdir.startswith("/"):
        container["workingDir"] = config.workdir
    if gpus:
        # A quantity: the core API's type is a string (the CRD also takes an integer).
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    pod: dict[str, Any] = {"containers": [container]}
    if pvc:
        container["volumeMounts"] = [{"name": CHECKPOINT_VOLUME, "mountPath": checkpoint_dir}]
        pod["volumes"] = [{"name": CHECKPOINT_VOLUME,
                           "persistentVolumeClaim": {"claimName": pvc}}]
    return pod


def _tfjob_spec(loaded: LoadedConfig, specs: dict[str, Any]) -> dict[str, Any]:
    """The TFJob's `spec`: its run and success policies around the replica specs."""
    config = loaded.config
    spec: dict[str, Any] = {
        "runPolicy": {
            # The operator's budget of restarts for the whole job.
            "backoffLimit": config.restart.max_restarts,
            # When the job ends, delete the pods still running (the ps and workers of a
            # parameter_server job never exit by themselves); finished pods keep their logs.
            "cleanPodPolicy": "Running",
        },
    }
    if config.strategy != Strategy.PARAMETER_SERVER:
        # As the launcher: the job succeeds when every worker has exited 0, not when
        # worker 0 has (the operator's default). With a Chief replica the operator
        # judges by the chief alone, which under MWMS finishes with the workers.
        spec["successPolicy"] = "AllWorkers"
    # parameter_server: the default, the chief (the coordinator, the only task that
    # runs the script) exiting 0 is success; its servers are then deleted.
    spec["tfReplicaSpecs"] = specs
    return spec


def tf_port_policy(manifest: dict[str, Any]) -> dict[str, Any]:
    """A NetworkPolicy admitting only the TFJob's own pods to its TF port
    (`security.tf_ports` not open), as the agents' firewall rules do over SSH.

    A policy that selects a pod denies it every connection no rule admits: the
    second rule keeps every other port open to anyone, as before.
    """
    name = manifest["metadata"]["name"]
    job_pods = {"matchLabels": {TFJOB_NAME_LABEL: name}}
    metadata: dict[str, Any] = {"name": f"{name}-tf-port",
                                "labels": dict(manifest["metadata"]["labels"])}
    if "namespace" in manifest["metadata"]:
        metadata["namespace"] = manifest["metadata"]["namespace"]
    others = [{"protocol": "TCP", "port": 1, "endPort": TFJOB_PORT - 1},
              {"protocol": "TCP", "port": TFJOB_PORT + 1, "endPort": 65535},
              {"protocol": "UDP", "port": 1, "endPort": 65535}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata,
            "spec": {"podSelector": job_pods, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": job_pods}],
                                  "ports": [{"protocol": "TCP", "port": TFJOB_PORT}]},
                                 {"ports": others}]}}


def tfjob_secret_refs(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Secret name -> the keys the manifest's containers read from it."""
    refs: dict[str, set[str]] = {}
    for spec in manifest["spec"]["tfReplicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.setdefault(ref["name"], set()).add(ref["key"])
    return {name: sorted(keys) for name, keys in sorted(refs.items())}


def tfjob_secret_commands(manifest: dict[str, Any]) -> list[str]:
    """`kubectl create secret generic ...` for each Secret the manifest reads (values elided)."""
    namespace = manifest["metadata"].get("namespace")
    where = f" -n {shlex.quote(namespace)}" if namespace else ""
    return [f"kubectl create secret generic {name}{where} "
            + " ".join(f"--from-literal={key}=..." for key in keys)
            for name, keys in tfjob_secret_refs(manifest).items()]


def _pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of the manifest's first replica type (they share env and volumes)."""
    return next(iter(manifest["spec"]["tfReplicaSpecs"].values()))["template"]["spec"]


def _plain_env(manifest: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["value"] for v in _pod_spec(manifest)["containers"][0].get("env", [])
            if "value" in v}


def checkpoint_volume(manifest: dict[str, Any]) -> tuple[str, str | None]:
    """(MGPU_CHECKPOINT_DIR, the PVC mounted there or None) of the manifest."""
    claims = [v["persistentVolumeClaim"]["claimName"]
              for v in _pod_spec(manifest).get("volumes", [])
              if v["name"] == CHECKPOINT_VOLUME and "persistentVolumeClaim" in v]
    return _plain_env(manifest).get("MGPU_CHECKPOINT_DIR", "?"), (claims[0] if claims else None)


def render_tfjob(manifest: dict[str, Any], source: str,
                 port_policy: dict[str, Any] | None = None) -> str:
    spec = manifest["spec"]
    policy = next(iter(spec["tfReplicaSpecs"].values()))["restartPolicy"]
    limit = spec["runPolicy"]["backoffLimit"]
    lines = [
        f"Kubeflow TFJob written by `mgpu-launch export --to tfjob` from {source}.",
        "Apply with: kubectl apply -f THIS_FILE (needs the Kubeflow training operator).",
        "The operator sets TF_CONFIG in every pod. The image must hold the training",
        "script and its dependencies (and mgpu-launch for a parameter_server job).",
        "",
    ]
    if policy == "ExitCode":
        lines += [
            f"Restarts: restartPolicy ExitCode, up to backoffLimit {limit} for the job. A pod",
            "killed by a signal (exit 128-255: 137 SIGKILL or out of memory, 143 SIGTERM)",
            "is recreated; an exit 1-127 fails the job for good: a Python exception (1),",
            "also the runtime's exit 42 after save_on_sigterm.",
        ]
        if _plain_env(manifest).get("MGPU_STRATEGY") == Strategy.MULTI_WORKER_MIRRORED:
            lines += ["Under multi_worker_mirrored the peers of a killed worker usually fail",
                      "with a TensorFlow error (exit 1): export with --restart-policy OnFailure",
                      "to restart on any failure."]
    elif policy == "OnFailure":
        lines += ["Restarts: restartPolicy OnFailure, any failure (a Python exception too),",
                  f"up to backoffLimit {limit} for the job."]
    else:
        lines += ["Restarts: none (restart.max_restarts is 0): the first failure fails the job."]
    if "Chief" in spec["tfReplicaSpecs"]:
        # The operator judges a job with a Chief replica by the chief alone.
        lines.append("Succeeds when the chief has exited 0 (with a Chief replica the operator "
                     "judges by it).")
    else:
        lines.append("Succeeds when every worker has exited 0 (successPolicy: AllWorkers).")
    lines.append("When it ends, the pods still running are deleted (cleanPodPolicy: Running).")
    checkpoint_dir, claim = checkpoint_volume(manifest)
    if claim:
        lines.append(f"Checkpoints: {checkpoint_dir}, on PersistentVolumeClaim {claim} "
                     "(ReadWriteMany: every pod sees it).")
    else:
        lines += [f"WARNING: checkpoints go to {checkpoint_dir} inside each pod: not shared, and",
                  "lost when a pod is recreated, so a restart starts over. Export with --pvc NAME",
                  "(a ReadWriteMany PersistentVolumeClaim) to mount a shared volume there."]
    commands = tfjob_secret_commands(manifest)
    if commands:
        lines += ["Secret-looking env values are not in this file: they are read from a Secret.",
                  "Create it first, with the values:", *(f"  {c}" for c in commands)]
    if port_policy is not None:
        name = port_policy["metadata"]["name"]
        lines += [f"TF port: NetworkPolicy {name} admits only this job's "
                  f"pods to port {TFJOB_PORT}",
                  "(security.tf_ports; enforced where the cluster's network plugin enforces "
                  "NetworkPolicy)."]
    header = "".join(f"# {line}\n" if line else "#\n" for line in lines)
    text = header + yaml.dump(manifest, Dumper=PlainDumper, sort_keys=False)
    if port_policy is not None:
        text += "---\n" + yaml.dump(port_policy, Dumper=PlainDumper, sort_keys=False)
    return text


class PlainDumper(yaml.SafeDumper):
    """Never writes YAML anchors/aliases: a manifest people read and edit."""

    def ignore_aliases(self, data: Any) -> bool:
        return True
