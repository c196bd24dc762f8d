"""`mgpu-launch export --to trainjob`: a Kubeflow Trainer v2 TrainJob and its runtime.

Owns the translation of a cluster YAML into a `TrainingRuntime` (or
`ClusterTrainingRuntime`) and a `TrainJob` of `trainer.kubeflow.org/v1alpha1`.
Trainer v2 has no TensorFlow runtime (kubeflow/trainer#2443; #2699 sends TensorFlow
users to the plain-ML runtime with TF_CONFIG written by hand): this export is that
runtime. The plain-ML policy (an `mlPolicy` naming no framework) sets no rank or
address variables; every trainer pod is an index of the JobSet's one replicated job
`node`, reachable as `<trainjob>-node-0-<i>.<trainjob>` with DNS hostnames on. The
pods run `python -m launcher.podstart SCRIPT ARGS`, which builds each task's
TF_CONFIG from `JOB_COMPLETION_INDEX` and the cluster the launcher's own plan gives
here (MGPU_TF_CLUSTER), then runs the script under the bootstrap as over SSH.

A failed pod fails its Job at once (`backoffLimit: 0`, pods `restartPolicy: Never`)
and the JobSet restarts every pod (`failurePolicy.maxRestarts`): a
MultiWorkerMirroredStrategy job can only recover by restarting all its processes.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

import yaml

from ..spec.addresses import TFAddress
from ..spec.config import LoadedConfig
from ..spec.plan import Plan, build_plan, ports_needed
from ..strategy import Strategy
from .export import (
    CHECKPOINT_VOLUME,
    DEFAULT_IMAGE,
    K8S_CHECKPOINT_ROOT,
    TFJOB_PORT,
    ExportError,
    PlainDumper,
    dns_name,
    env_var,
    pod_gpus,
    shared_env,
)

API_VERSION = "trainer.kubeflow.org/v1alpha1"
API_GROUP = "trainer.kubeflow.org"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
NODE = "node"  # Trainer's replicated job and container of the trainer pods
# The label Trainer looks for on the replicated job that runs the trainer.
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# JobSet labels every pod with its restart attempt: MGPU_GENERATION in the pod.
RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
EXPORTED = (Strategy.MULTI_WORKER_MIRRORED, Strategy.KERAS_DISTRIBUTION)
# Why the other strategies are refused (said to the user as is).
NOT_MAPPED = {
    Strategy.PARAMETER_SERVER:
        "parameter_server needs pods of three kinds (the chief runs the script, the ps and "
        "workers only serve it and never exit by themselves); a TrainJob's trainer is one "
        "replicated job of identical pods whose success needs every pod to exit 0: export "
        "it with --to tfjob (the v1 TFJob, whose cleanPodPolicy ends the servers)",
    Strategy.LEGACY_SERVER:
        "legacy_server's ps tasks serve until the launcher stops them; in a TrainJob "
        "nothing would stop them: export it with --to tfjob",
}
# Pod-level env the pod start reads; the rest of the plan's per-task env it sets.
_PER_POD = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
            "KERAS_DISTRIBUTION_PROCESS_ID")
_HOSTNAME_MAX = 63  # a DNS label
TERMINATION_LOG = "/dev/termination-log"  # Kubernetes' default terminationMessagePath


def pod_hostname(job: str, index: int) -> str:
    """The DNS name of trainer pod `index` (JobSet: <jobset>-<rjob>-<job index>-<pod index>)."""
    return f"{job}-{NODE}-0-{index}.{job}"


def _port_base(loaded: LoadedConfig) -> int:
    base = loaded.config.ports.base
    return base if isinstance(base, int) else TFJOB_PORT


def trainjob_plan(loaded: LoadedConfig, command: Sequence[str], job: str) -> Plan:
    """The launcher's plan with pod i's DNS name as task i's host: TF_CONFIG's cluster.

    Every pod has its own address, so one port would do; the plan's ports (one per
    task from ports.base) keep the pods apart where they share one (a test)."""
    config = loaded.config
    if config.strategy not in EXPORTED:
        raise ExportError(f"strategy {config.strategy} does not map to a TrainJob: "
                          f"{NOT_MAPPED.get(config.strategy, '')}")
    probe = build_plan(loaded, command, run_dir="/unused",
                       ports=list(range(1, ports_needed(config) + 1)))
    roles = [t.role for t in probe.tasks]
    if "evaluator" in roles:
        raise ExportError("an evaluator task is outside TF_CONFIG's cluster and runs a "
                          "different loop: a TrainJob's pods are the chief and workers only; "
                          "drop the evaluator role (or export with --to tfjob)")
    if roles.count("chief") > 1:
        raise ExportError("more than one chief task: a job has at most one")
    hosts = list(dict.fromkeys(t.host for t in probe.tasks))
    if len(hosts) != len(probe.tasks):
        raise ExportError("a host runs several tasks (roles or tasks_per_host: per_gpu): "
                          "a trainer pod runs one; give each task its own host entry")
    last = pod_hostname(job, len(hosts) - 1).split(".")[0]
    if len(last) > _HOSTNAME_MAX:
        raise ExportError(f"the pods' host names ({last}) pass {_HOSTNAME_MAX} characters: "
                          "shorten `name:`")
    # Pod i is task i: the chief first (podstart's order), so host order = task order.
    ordered = [t.host for t in sorted(probe.tasks, key=lambda t: (t.role != "chief", t.index))]
    addresses = {host: TFAddress(host=host, address=pod_hostname(job, i), rule="tf_address",
                                 why="the TrainJob's pod DNS name")
                 for i, host in enumerate(ordered)}
    base = _port_base(loaded)
    return build_plan(loaded, command, run_dir="/unused", addresses=addresses,
                      ports=[base + i for i in range(len(hosts))])


def _checkpoint_dir(loaded: LoadedConfig, given: str | None) -> str:
    configured = loaded.config.checkpoint.dir
    if given is not None:
        return given
    if configured and configured.startswith("/"):
        return configured
    return f"{K8S_CHECKPOINT_ROOT}/{loaded.config.name}"


def trainjob_manifests(loaded: LoadedConfig, command: Sequence[str], *,
                       image: str = DEFAULT_IMAGE, checkpoint_dir: str | None = None,
                       pvc: str | None = None, namespace: str | None = None,
                       runtime_kind: str = "TrainingRuntime") -> list[dict[str, Any]]:
    """[the runtime, the TrainJob that uses it], and, unless `security.tf_ports` is
    open, the NetworkPolicy that seals the job's TF ports."""
    if runtime_kind not in RUNTIME_KINDS:
        raise ExportError(f"runtime kind {runtime_kind!r}: one of {', '.join(RUNTIME_KINDS)}")
    config = loaded.config
    job = dns_name(config.name)
    plan = trainjob_plan(loaded, command, job)
    checkpoint_dir = _checkpoint_dir(loaded, checkpoint_dir)
    runtime_name = f"{job}-mgpu"
    labels = {"app.kubernetes.io/created-by": "mgpu-launch"}
    runtime_meta: dict[str, Any] = {"name": runtime_name, "labels": dict(labels)}
    job_meta: dict[str, Any] = {"name": job, "labels": dict(labels)}
    if namespace:
        job_meta["namespace"] = namespace
        if runtime_kind == "TrainingRuntime":  # a ClusterTrainingRuntime has none
            runtime_meta["namespace"] = namespace
    runtime = {"apiVersion": API_VERSION, "kind": runtime_kind, "metadata": runtime_meta,
               "spec": _runtime_spec(loaded, plan, image=image, checkpoint_dir=checkpoint_dir,
                                     pvc=pvc, secret=f"{job}-env")}
    task = plan.tasks[0]
    trainer: dict[str, Any] = {
        "numNodes": len(plan.tasks),
        "image": image,
        # The pod start picks the task from JOB_COMPLETION_INDEX, then the bootstrap runs it.
        "command": [config.python or "python3", "-m", "launcher.podstart", *task.command],
    }
    gpus = pod_gpus(plan.tasks)
    if gpus:
        trainer["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    trainjob = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": job_meta,
                "spec": {"runtimeRef": {"name": runtime_name, "apiGroup": API_GROUP,
                                        "kind": runtime_kind},
                         "trainer": trainer}}
    manifests = [runtime, trainjob]
    if config.security.tf_ports != "open":
        manifests.append(tf_port_policy(trainjob, [t.port for t in plan.tasks if t.port]))
    return manifests


def _runtime_spec(loaded: LoadedConfig, plan: Plan, *, image: str, checkpoint_dir: str,
                  pvc: str | None, secret: str) -> dict[str, Any]:
    config = loaded.config
    task = plan.tasks[0]
    env = {k: v for k, v in shared_env(task, checkpoint_dir).items() if k not in _PER_POD}
    env["MGPU_TF_CLUSTER"] = json.dumps(dict(task.tf_config["cluster"]),
                                        default=list, separators=(",", ":"))
    # The bootstrap's error record (type, message, traceback) of a task that dies of
    # an exception goes where Kubernetes shows it: the pod's termination message.
    env["MGPU_ERROR_FILE"] = TERMINATION_LOG
    container: dict[str, Any] = {
        "name": NODE, "image": image,
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "env": [*(env_var(k, v, secret) for k, v in sorted(env.items())),
                {"name": "MGPU_RESTART_ATTEMPT", "valueFrom": {"fieldRef": {
                    "fieldPath": f"metadata.labels['{RESTART_LABEL}']"}}}],
    }
    if config.workdir and config.workdir.startswith("/"):
        container["workingDir"] = config.workdir
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if pvc:
        container["volumeMounts"] = [{"name": CHECKPOINT_VOLUME, "mountPath": checkpoint_dir}]
        pod["volumes"] = [{"name": CHECKPOINT_VOLUME,
                           "persistentVolumeClaim": {"claimName": pvc}}]
    ml_policy: dict[str, Any] = {"numNodes": len(plan.tasks)}
    if config.strategy == Strategy.KERAS_DISTRIBUTION:
        ml_policy["jax"] = {}  # Trainer's JAX plugin: JAX_* variables, read by podstart
    return {
        "mlPolicy": ml_policy,
        "template": {"spec": {
            "network": {"enableDNSHostnames": True},
            # The whole JobSet is recreated on a failure, up to this many times.
            "failurePolicy": {"maxRestarts": config.restart.max_restarts},
            "replicatedJobs": [{
                "name": NODE, "replicas": 1,
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
                    # A failed pod fails the Job at once: the JobSet restarts them all.
                    "spec": {"backoffLimit": 0, "template": {"spec": pod}},
                },
            }],
        }},
    }


def tf_port_policy(trainjob: dict[str, Any], ports: Sequence[int]) -> dict[str, Any]:
    """A NetworkPolicy admitting only the TrainJob's own pods (JobSet's label on every
    pod) to its TF ports (`security.tf_ports` not open), as the agents' firewall rules
    do over SSH. A policy that selects a pod denies it what no rule admits: the second
    rule keeps every other port open to anyone, as before."""
    name = trainjob["metadata"]["name"]
    low, high = min(ports), max(ports)
    job_pods = {"matchLabels": {JOBSET_NAME_LABEL: name}}
    metadata: dict[str, Any] = {"name": f"{name}-tf-ports",
                                "labels": dict(trainjob["metadata"]["labels"])}
    if "namespace" in trainjob["metadata"]:
        metadata["namespace"] = trainjob["metadata"]["namespace"]
    tf_ports: dict[str, Any] = {"protocol": "TCP", "port": low}
    if high > low:
        tf_ports["endPort"] = high
    others = [{"protocol": "TCP", "port": 1, "endPort": low - 1}] if low > 1 else []
    if high < 65535:
        others.append({"protocol": "TCP", "port": high + 1, "endPort": 65535})
    others.append({"protocol": "UDP", "port": 1, "endPort": 65535})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": metadata,
            "spec": {"podSelector": job_pods, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": job_pods}], "ports": [tf_ports]},
                                 {"ports": others}]}}


def _container(runtime: dict[str, Any]) -> dict[str, Any]:
    job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    return job["template"]["spec"]["template"]["spec"]["containers"][0]


def secret_commands(manifests: Sequence[dict[str, Any]]) -> list[str]:
    """`kubectl create secret generic ...` for the Secret the runtime reads (values elided)."""
    runtime, trainjob = manifests[:2]
    refs: dict[str, list[str]] = {}
    for var in _container(runtime).get("env", []):
        ref = var.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs.setdefault(ref["name"], []).append(ref["key"])
    namespace = trainjob["metadata"].get("namespace")
    where = f" -n {namespace}" if namespace else ""
    return [f"kubectl create secret generic {name}{where} "
            + " ".join(f"--from-literal={key}=..." for key in keys)
            for name, keys in refs.items()]


def render(manifests: Sequence[dict[str, Any]], source: str) -> str:
    """The two documents under a header saying what they do and what to do first."""
    runtime, trainjob = manifests[:2]
    spec = runtime["spec"]["template"]["spec"]
    container = _container(runtime)
    plain = {v["name"]: v.get("value") for v in container["env"]}
    job = trainjob["metadata"]["name"]
    nodes = trainjob["spec"]["trainer"]["numNodes"]
    restarts = spec["failurePolicy"]["maxRestarts"]
    lines = [
        f"Kubeflow Trainer v2 {runtime['kind']} and TrainJob written by",
        f"`mgpu-launch export --to trainjob` from {source}.",
        "Apply with: kubectl apply -f THIS_FILE (needs Kubeflow Trainer v2 and JobSet).",
        f"{nodes} trainer pods ({pod_hostname(job, 0)} ...): each runs `python -m "
        "launcher.podstart`,",
        "which builds its TF_CONFIG from JOB_COMPLETION_INDEX and MGPU_TF_CLUSTER; the image",
        "must hold mgpu-launch, the script and its dependencies (docker/Dockerfile).",
        f"Restarts: a failed pod fails the job's pods together; up to {restarts}",
        "restarts of the whole JobSet (failurePolicy.maxRestarts), which resume from the",
        "checkpoints.",
    ]
    claims = [v["persistentVolumeClaim"]["claimName"]
              for v in runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
              ["spec"]["template"]["spec"].get("volumes", [])]
    where = plain.get("MGPU_CHECKPOINT_DIR")
    if claims:
        lines.append(f"Checkpoints: {where}, on PersistentVolumeClaim {claims[0]} "
                     "(ReadWriteMany).")
    else:
        lines += [f"WARNING: checkpoints go to {where} inside each pod: not shared and lost "
                  "on a", "restart. Export with --pvc NAME to mount a shared volume there."]
    commands = secret_commands(manifests)
    if commands:
        lines += ["Secret-looking env values are read from a Secret; create it first:",
                  *(f"  {c}" for c in commands)]
    if len(manifests) > 2:
        policy = manifests[2]
        ports = policy["spec"]["ingress"][0]["ports"][0]
        lines += [f"TF ports: NetworkPolicy {policy['metadata']['name']} admits only this "
                  f"job's pods to {ports['port']}-{ports.get('endPort', ports['port'])}",
                  "(security.tf_ports; enforced where the network plugin enforces "
                  "NetworkPolicy)."]
    lines.append("A task that dies of an exception leaves its error in the pod's "
                 "termination message.")
    header = "".join(f"# {line}\n" for line in lines)
    return header + "---\n".join(yaml.dump(m, Dumper=PlainDumper, sort_keys=False)
                                 for m in manifests)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runtime-kind", choices=RUNTIME_KINDS, default="TrainingRuntime",
                        help="trainjob: the runtime's kind (default TrainingRuntime, in the "
                        "TrainJob's namespace; ClusterTrainingRuntime: cluster-wide)")


def export_text(loaded: LoadedConfig, command: Sequence[str], args: argparse.Namespace,
                source: str) -> tuple[str, list[str]]:
    """The file's text and the notes for the standard error."""
    manifests = trainjob_manifests(loaded, command, image=args.image,
                                   checkpoint_dir=args.checkpoint_dir, pvc=args.pvc,
                                   namespace=args.namespace, runtime_kind=args.runtime_kind)
    notes = [f"secret-looking env values are read from a Secret; create it first: {c}"
             for c in secret_commands(manifests)]
    if not args.pvc:
        notes.append("warning: no --pvc: the checkpoint directory is not shared by the pods "
                      "and a restarted job starts over")
    return render(manifests, source), notes

