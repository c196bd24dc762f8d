"""`mgpu-launch export --to slurm|tfjob CLUSTER.yaml SCRIPT [ARGS...]`: leave SSH behind.

Owns the translation of a cluster YAML into a Slurm batch script or a Kubeflow
`TFJob` manifest (kubeflow.org/v1), so a job that outgrew SSH moves to the
scheduler a company already runs, with the same roles, environment, restart
policy and TF_CONFIG layout.

The Slurm script builds each task's TF_CONFIG on its node from Slurm's
variables, with the functions in the "runs on Slurm nodes" section below: they
are embedded in the script verbatim (`inspect.getsource`), use the standard
library only, and give the same cluster, task indices and ports as
`build_plan` when the Slurm node names equal the YAML's addresses.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from .config import ConfigError, LoadedConfig, load_config
from .plan import CLUSTER_ROLES, ROLE_ORDER, Plan, PlanError, Task, build_plan, ports_needed

EXIT_OK, EXIT_USAGE = 0, 2
DEFAULT_IMAGE = "mgpu-launch-worker:latest"  # built from docker/Dockerfile (README.md, Docker)
DEFAULT_PORT_BASE = 23456  # when the YAML says `ports: {base: auto}`
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


def _layout(plan: Plan) -> list[dict[str, int]]:
    """Role counts per host, hosts in plan order."""
    layout = []
    for host in plan.hosts:
        counts: dict[str, int] = {}
        for task in plan.tasks_on(host.name):
            counts[task.role] = counts.get(task.role, 0) + 1
        layout.append(counts)
    return layout


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
# One Slurm node per host of the YAML, in order; each node runs that host's tasks
# (`srun --ntasks-per-node`). TF_CONFIG is built on each node from SLURM_STEP_NODELIST /
# SLURM_JOB_NODELIST (expanded with `scontrol show hostnames` when available),
# SLURMD_NODENAME / SLURM_NODEID and SLURM_LOCALID, with ports {port_base}, {port_base}+1, ...
# in task order, as `mgpu-launch --dry-run` shows them for the YAML.{idle_note}
# Restart policy from the YAML: up to {max_restarts} restart(s) of the whole step,
# {backoff_s} s apart; workers resume from the checkpoints in MGPU_CHECKPOINT_DIR.
# To see each task's TF_CONFIG without training: MGPU_SLURM_DRY_RUN=1 sbatch {output_name}
{directives}

set -u -o pipefail

MGPU_SLURM_TASK_PY=$(cat <<'MGPU_TASK_PY'
{task_py}
MGPU_TASK_PY
)
export MGPU_SLURM_TASK_PY

max_restarts={max_restarts}
backoff_s={backoff_s}
attempt=0
while true; do
    export MGPU_GENERATION=$attempt
    srun --kill-on-bad-exit=1 --nodes={nodes} --ntasks-per-node={per_node} \\
        {python} -c 'import os; exec(os.environ["MGPU_SLURM_TASK_PY"])' {command}
    rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "mgpu-launch: job succeeded (generation $attempt)"
        exit 0
    fi
    if [ "$attempt" -ge "$max_restarts" ]; then
        echo "mgpu-launch: job failed with exit code $rc after $attempt restart(s)" >&2
        exit "$rc"
    fi
    attempt=$((attempt + 1))
    echo "mgpu-launch: step failed (exit code $rc); restart $attempt of $max_restarts" \\
         "in $backoff_s s" >&2
    sleep "$backoff_s"
done
"""


def slurm_script(loaded: LoadedConfig, command: Sequence[str], *, port_base: int | None = None,
                 partition: str | None = None, time_limit: str | None = None,
                 output_name: str = "job.sbatch") -> str:
    config = loaded.config
    if port_base is None:
        port_base = config.ports.base if isinstance(config.ports.base, int) else DEFAULT_PORT_BASE
    plan = _plan(loaded, command)
    layout = _layout(plan)
    counts = [sum(roles.values()) for roles in layout]
    per_node = max(counts)
    # Per node: every GPU its tasks use (Slurm sets CUDA_VISIBLE_DEVICES from --gres).
    gpus = max(len(h.gpus) for h in plan.hosts)
    directives = [f"#SBATCH --job-name={config.name}", f"#SBATCH --nodes={len(layout)}",
                  f"#SBATCH --ntasks-per-node={per_node}", f"#SBATCH --output={config.name}-%j.out"]
    if gpus:
        directives.append(f"#SBATCH --gres=gpu:{gpus}")
    workdir = loaded.resolve_path(config.workdir)
    if workdir is not None:
        directives.append(f"#SBATCH --chdir={workdir}")
    if partition:
        directives.append(f"#SBATCH --partition={partition}")
    if time_limit:
        directives.append(f"#SBATCH --time={time_limit}")
    settings = {
        "name": config.name,
        "strategy": config.strategy,
        "layout": layout,
        "port_base": port_base,
        "env": _shared_env(plan.tasks[0]),
        "grace_s": config.restart.grace_s,
    }
    idle_note = ""
    if len(set(counts)) > 1:
        idle_note = ("\n# Hosts run different numbers of tasks: on a node with fewer, the "
                     "surplus Slurm tasks exit 0 at once.")
    return _SLURM_TEMPLATE.format(
        source=loaded.source or "a generated config",
        output_name=output_name,
        port_base=port_base,
        idle_note=idle_note,
        max_restarts=config.restart.max_restarts,
        backoff_s=f"{config.restart.backoff_s:g}",
        directives="\n".join(directives),
        task_py=slurm_task_program(settings),
        nodes=len(layout),
        per_node=per_node,
        python=shlex.quote(config.python or "python3"),
        command=shlex.join(command),
    )


def slurm_task_program(settings: dict[str, Any]) -> str:
    """The Python program each Slurm task runs (stdlib only, embedded in the script)."""
    functions = [expand_hostlist, _split_top_level, _expand_brackets, slurm_nodes,
                 slurm_task_setup, slurm_task_main]
    parts = [
        # Annotations stay unevaluated, as in this module (nodes may run an older Python).
        "from __future__ import annotations",
        "# Built by mgpu-launch export: TF_CONFIG for this Slurm task, then the script.",
        "import json, os, shutil, signal, subprocess, sys, time",
        "",
        f"ROLE_ORDER = {ROLE_ORDER!r}",
        f"CLUSTER_ROLES = {CLUSTER_ROLES!r}",
        f"SETTINGS = json.loads({json.dumps(json.dumps(settings, sort_keys=True))})",
        "",
    ]
    for function in functions:
        parts.append(inspect.getsource(function))
    parts.append("slurm_task_main(SETTINGS, dict(os.environ), sys.argv[1:])")
    return "\n".join(parts)


# ---------------------------------------------------- runs on Slurm nodes
# Everything from here to the TFJob section is embedded in the batch script and
# must use only the standard library and the names defined in
# `slurm_task_program` (json, os, shutil, signal, subprocess, sys, time,
# ROLE_ORDER, CLUSTER_ROLES).


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact host list (`node[01-02],gpu3`, `r[1-2]-n[1,3]`) as names, in order."""
    names = []
    for part in _split_top_level(text):
        if part:
            names.extend(_expand_brackets(part))
    return names


def _split_top_level(text: str) -> list[str]:
    """Split on the commas that are not inside brackets."""
    parts, depth, current = [], 0, ""
    for char in text.strip():
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return parts


def _expand_brackets(pattern: str) -> list[str]:
    """Expand the first `[...]` of `pattern` (ranges keep their zero padding), recursively."""
    start = pattern.find("[")
    if start < 0:
        return [pattern]
    end = pattern.index("]", start)
    head, body, tail = pattern[:start], pattern[start + 1:end], pattern[end + 1:]
    values = []
    for item in body.split(","):
        item = item.strip()
        if "-" in item:
            low, high = item.split("-", 1)
            width = len(low)  # Slurm pads to the low bound's width: 01-10
            values.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
        elif item:
            values.append(item)
    out = []
    for value in values:
        out.extend(_expand_brackets(head + value + tail))
    return out


def slurm_nodes(environ: dict[str, str]) -> list[str]:
    """The nodes of this job step, in Slurm's order."""
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    if not nodelist:
        raise SystemExit("mgpu-launch: SLURM_JOB_NODELIST is not set: run under sbatch/srun")
    if shutil.which("scontrol"):
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.split():
            return done.stdout.split()
    return expand_hostlist(nodelist)


def slurm_task_setup(settings: dict, environ: dict[str, str]) -> dict | None:
    """TF_CONFIG and environment of this Slurm task; None for a surplus (idle) task.

    Node i of the allocation plays host i of the YAML; the task with local id j
    on it is that host's j-th task (chief, workers, ps, evaluator in this order),
    indices and ports counted across hosts exactly as the launcher's plan does.
    """
    nodes = slurm_nodes(environ)
    layout = settings["layout"]
    if len(nodes) != len(layout):
        raise SystemExit(f"mgpu-launch: the YAML has {len(layout)} hosts but Slurm gave "
                         f"{len(nodes)} nodes ({', '.join(nodes)}); use --nodes={len(layout)}")
    me = environ.get("SLURMD_NODENAME", "")
    node = nodes.index(me) if me in nodes else int(environ["SLURM_NODEID"])
    local = int(environ.get("SLURM_LOCALID", "0"))

    slots = []  # (role, index, node) in the plan's order: role-major, hosts in order
    for role in ROLE_ORDER:
        index = 0
        for host, roles in enumerate(layout):
            for _ in range(roles.get(role, 0)):
                slots.append((role, index, host))
                index += 1
    serving = [slot for slot in slots if slot[0] in CLUSTER_ROLES]
    cluster = {}
    for i, (role, _index, host) in enumerate(serving):
        cluster.setdefault(role, []).append(f"{nodes[host]}:{settings['port_base'] + i}")
    mine = [slot for slot in slots if slot[2] == node]
    if local >= len(mine):
        return None
    role, index, _ = mine[local]
    job = environ.get("SLURM_JOB_ID", "0")
    env = dict(settings["env"])
    env.update(
        MGPU_TASK_TYPE=role, MGPU_TASK_INDEX=str(index), MGPU_HOST=nodes[node],
        MGPU_GENERATION=environ.get("MGPU_GENERATION", "0"),
        MGPU_RUN_DIR=os.path.expanduser(
            f"~/.mgpu-launch/runs/{settings['name']}-slurm{job}/{nodes[node]}"),
    )
    tf_config = {"cluster": cluster, "task": {"type": role, "index": index}}
    return {"tf_config": tf_config, "env": env, "procid": environ.get("SLURM_PROCID")}


def slurm_task_main(settings: dict, environ: dict[str, str], argv: list[str]) -> None:
    """Set TF_CONFIG (in the environment, never on a command line) and run the script."""
    setup = slurm_task_setup(settings, environ)
    if environ.get("MGPU_SLURM_DRY_RUN"):
        print(json.dumps(setup, sort_keys=True), flush=True)
        sys.exit(0)
    if setup is None:
        sys.exit(0)  # a surplus task on a host with fewer tasks than --ntasks-per-node
    env = dict(environ)
    env.pop("MGPU_SLURM_TASK_PY", None)
    env.update(setup["env"])
    env["TF_CONFIG"] = json.dumps(setup["tf_config"], sort_keys=True)
    os.makedirs(env["MGPU_RUN_DIR"], mode=0o700, exist_ok=True)
    argv = [sys.executable, *argv]
    role = setup["tf_config"]["task"]["type"]
    if settings["strategy"] != "parameter_server":
        os.execve(sys.executable, argv, env)
    # Parameter-server workers and ps never exit by themselves: the chief marks
    # the end in the shared checkpoint directory and the others stop on it.
    marker = os.path.join(env["MGPU_CHECKPOINT_DIR"], ".mgpu-slurm",
                          f"{environ.get('SLURM_JOB_ID', '0')}-{env['MGPU_GENERATION']}.done")
    child = subprocess.Popen(argv, env=env)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda s, _f: child.send_signal(s))
    while child.poll() is None:
        if role != "chief" and os.path.exists(marker):
            child.terminate()
            try:
                child.wait(timeout=settings["grace_s"])
            except subprocess.TimeoutExpired:
                child.kill()
            sys.exit(0)
        time.sleep(0.5)
    code = child.returncode
    if role == "chief" and code == 0:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w") as handle:
            handle.write("done\n")
    sys.exit(code if code >= 0 else 128 - code)


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
                        help=f"slurm: first port (default ports.base, or {DEFAULT_PORT_BASE} "
                        "when it is auto)")
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
