"""`mgpu-launch export --to slurm|tfjob CLUSTER.yaml SCRIPT [ARGS...]`: leave SSH behind.

Owns the translation of a cluster YAML into a Slurm batch script or a Kubeflow
`TFJob` manifest (kubeflow.org/v1), so a job that outgrew SSH moves to the
scheduler a company already runs, with the same roles, environment, restart
policy and TF_CONFIG layout.

The Slurm batch script runs mgpu-launch itself inside the allocation, with
the YAML turned into `transport: slurm` (launcher.job.slurm), so a batch job gets
the launcher's own plan, supervision, restarts and run records.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..job.config import ConfigError, LoadedConfig, load_config
from ..job.plan import (
    ROLE_ORDER,
    Plan,
    PlanError,
    Task,
    build_plan,
    default_checkpoint_dir,
    ports_needed,
)
from ..job.slurm import NODE_BY_POSITION

EXIT_OK, EXIT_USAGE = 0, 2
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


def _shared_env(task: Task, checkpoint_dir: str | None = None) -> dict[str, str]:
    """The environment of `task` as the launcher builds it, less what is per task."""
    env = {k: v for k, v in task.env.items() if k not in _PER_TASK_ENV}
    if checkpoint_dir is not None:
        env["MGPU_CHECKPOINT_DIR"] = checkpoint_dir
    return env


def _gpus(tasks: Sequence[Task]) -> int:
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
    data = {"transport": "slurm", **config.model_dump(mode="json", exclude_unset=True)}
    data["transport"] = "slurm"
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
                 output_name: str = "job.sbatch", python: str | None = None) -> str:
    config = loaded.config
    _plan(loaded, command)  # refuse a config the launcher could not plan
    gpus = max(len(h.gpus) for h in config.hosts)
    directives = [f"#SBATCH --job-name={config.name}", f"#SBATCH --nodes={len(config.hosts)}",
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


# ------------------------------------------------------------------- TFJob


def _dns_name(name: str) -> str:
    """A TFJob name must be a DNS-1035 label: lower case, digits and '-', a letter first."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"job-{label}".rstrip("-")
    return label[:63].rstrip("-")


def tfjob_manifest(loaded: LoadedConfig, command: Sequence[str], *, image: str = DEFAULT_IMAGE,
                   checkpoint_dir: str | None = None, pvc: str | None = None,
                   namespace: str | None = None) -> dict[str, Any]:
    """A kubeflow.org/v1 TFJob: one replica spec per role, counts summed over the hosts."""
    config = loaded.config
    if checkpoint_dir is None:
        configured = config.checkpoint.dir
        checkpoint_dir = (configured if configured and configured.startswith("/")
                          else f"{K8S_CHECKPOINT_ROOT}/{config.name}")
    plan = _plan(loaded, command)
    # The launcher restarts on any failure, up to max_restarts: OnFailure with the same
    # backoff limit. (ExitCode would give up on exit codes 1-127, e.g. a Python exception.)
    restart_policy = "OnFailure" if config.restart.max_restarts > 0 else "Never"
    argv = [config.python or "python3", *command]

    specs: dict[str, Any] = {}
    for role in ROLE_ORDER:
        tasks = [t for t in plan.tasks if t.role == role]
        if not tasks:
            continue
        gpus = _gpus(tasks)
        env = _shared_env(tasks[0], checkpoint_dir=checkpoint_dir)
        container: dict[str, Any] = {
            "name": TFJOB_CONTAINER,
            "image": image,
            "command": list(argv),
            "env": [{"name": k, "value": v}
                    for k, v in sorted({**env, "MGPU_TASK_TYPE": role}.items())],
        }
        if config.workdir and config.workdir.startswith("/"):
            container["workingDir"] = config.workdir
        if gpus:
            container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
        pod: dict[str, Any] = {"containers": [container]}
        if pvc:
            container["volumeMounts"] = [{"name": "checkpoints", "mountPath": checkpoint_dir}]
            pod["volumes"] = [{"name": "checkpoints",
                               "persistentVolumeClaim": {"claimName": pvc}}]
        specs[TFJOB_REPLICA_TYPES[role]] = {
            "replicas": len(tasks),
            "restartPolicy": restart_policy,
            "template": {"spec": pod},
        }
    metadata: dict[str, Any] = {"name": _dns_name(config.name),
                                "labels": {"app.kubernetes.io/created-by": "mgpu-launch"}}
    if namespace:
        metadata["namespace"] = namespace
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": metadata,
        "spec": {
            "runPolicy": {
                "backoffLimit": config.restart.max_restarts,
                # Parameter servers never exit by themselves: delete what still runs.
                "cleanPodPolicy": "Running",
            },
            "tfReplicaSpecs": specs,
        },
    }


def render_tfjob(manifest: dict[str, Any], source: str) -> str:
    header = (
        f"# Kubeflow TFJob written by `mgpu-launch export --to tfjob` from {source}.\n"
        "# Apply with: kubectl apply -f THIS_FILE (needs the Kubeflow training operator).\n"
        "# The operator sets TF_CONFIG in every pod. The image must hold the training\n"
        "# script and its dependencies; MGPU_CHECKPOINT_DIR must be shared by every pod\n"
        "# (use --pvc NAME to mount a ReadWriteMany volume there).\n"
    )
    return header + yaml.dump(manifest, Dumper=_PlainDumper, sort_keys=False)


class _PlainDumper(yaml.SafeDumper):
    """Never writes YAML anchors/aliases: a manifest people read and edit."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


# -------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mgpu-launch export",
        description="Write a Slurm batch script or a Kubeflow TFJob manifest for the job.")
    parser.add_argument("--to", required=True, choices=("slurm", "tfjob"))
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    parser.add_argument("--port-base", type=int, metavar="PORT",
                        help="slurm: first port (default ports.base; `auto` picks one per "
                        "job from its id)")
    parser.add_argument("--partition", help="slurm: #SBATCH --partition")
    parser.add_argument("--time", dest="time_limit", help="slurm: #SBATCH --time")
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help=f"tfjob: container image (default {DEFAULT_IMAGE})")
    parser.add_argument("--pvc", metavar="NAME",
                        help="tfjob: PersistentVolumeClaim mounted at the checkpoint dir")
    parser.add_argument("--checkpoint-dir", metavar="PATH",
                        help=f"tfjob: checkpoint dir in the pods (default checkpoint.dir when "
                        f"absolute, else {K8S_CHECKPOINT_ROOT}/NAME)")
    parser.add_argument("--namespace", help="tfjob: metadata.namespace")
    parser.add_argument("cluster", metavar="CLUSTER.yaml")
    parser.add_argument("command", metavar="SCRIPT [ARGS...]", nargs=argparse.REMAINDER)
    return parser


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `export` (as dispatched by the CLI)."""
    args = _parser().parse_args(list(argv)[1:])
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("mgpu-launch export: no training script given", file=sys.stderr)
        return EXIT_USAGE
    try:
        loaded = load_config(args.cluster)
        if args.to == "slurm":
            name = Path(args.output).name if args.output else f"{loaded.config.name}.sbatch"
            text = slurm_script(loaded, command, port_base=args.port_base,
                                partition=args.partition, time_limit=args.time_limit,
                                output_name=name)
        else:
            manifest = tfjob_manifest(loaded, command, image=args.image,
                                      checkpoint_dir=args.checkpoint_dir, pvc=args.pvc,
                                      namespace=args.namespace)
            text = render_tfjob(manifest, args.cluster)
    except ConfigError as exc:
        print(f"mgpu-launch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (PlanError, ExportError) as exc:
        print(f"mgpu-launch export: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.output:
        # Private: the YAML's `env` may hold tokens.
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if args.to == "slurm":
            print(f"wrote {args.output}; submit with: sbatch {shlex.quote(args.output)}",
                  file=sys.stderr)
        else:
            print(f"wrote {args.output}; apply with: kubectl apply -f "
                  f"{shlex.quote(args.output)}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return EXIT_OK
