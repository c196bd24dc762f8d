"""`mgpu-launch export --to slurm|tfjob|trainjob CLUSTER.yaml SCRIPT [ARGS...]`: leave SSH behind.

argv in, the cluster file translated (launcher/tools/export.py: a Slurm batch
script or a Kubeflow TFJob; launcher/tools/export_trainjob.py: a Trainer v2
TrainJob), the text written (private: 0600) or printed, an exit code. Reaches
no host.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..spec.config import ConfigError, load_config
from ..spec.plan import PlanError
from ..tools import export_trainjob
from ..tools.export import (
    DEFAULT_IMAGE,
    DEFAULT_TFJOB_RESTART_POLICY,
    K8S_CHECKPOINT_ROOT,
    TFJOB_RESTART_POLICIES,
    ExportError,
    checkpoint_volume,
    render_tfjob,
    slurm_script,
    tf_port_policy,
    tfjob_manifest,
    tfjob_secret_commands,
)
from . import exits, usage


def _parser() -> argparse.ArgumentParser:
    parser = usage.Parser(
        prog="mgpu-launch export",
        description="Write a Slurm batch script, a Kubeflow Trainer v2 TrainJob or a "
        "Kubeflow v1 TFJob manifest for the job.")
    parser.add_argument("--to", required=True, choices=("slurm", "tfjob", "trainjob"))
    parser.add_argument("-o", "--output", metavar="FILE", help="write here (default: stdout)")
    parser.add_argument("--port-base", type=int, metavar="PORT",
                        help="slurm: first port (default ports.base; `auto` picks one per "
                        "job from its id)")
    parser.add_argument("--nodes", type=int, metavar="N",
                        help="slurm: nodes to allocate, for a cluster file without hosts "
                        "(each node runs a worker)")
    parser.add_argument("--gpus-per-node", type=int, metavar="G",
                        help="slurm, with --nodes: GPUs of each node (#SBATCH --gres=gpu:G)")
    parser.add_argument("--partition", help="slurm: #SBATCH --partition")
    parser.add_argument("--time", dest="time_limit", help="slurm: #SBATCH --time")
    parser.add_argument("--image", default=DEFAULT_IMAGE,
                        help=f"tfjob, trainjob: container image (default {DEFAULT_IMAGE})")
    parser.add_argument("--pvc", metavar="NAME",
                        help="tfjob, trainjob: PersistentVolumeClaim mounted at the "
                        "checkpoint dir")
    parser.add_argument("--checkpoint-dir", metavar="PATH",
                        help="tfjob, trainjob: checkpoint dir in the pods (default "
                        f"checkpoint.dir when absolute, else {K8S_CHECKPOINT_ROOT}/NAME)")
    parser.add_argument("--namespace", help="tfjob, trainjob: metadata.namespace")
    parser.add_argument("--restart-policy", choices=TFJOB_RESTART_POLICIES,
                        default=DEFAULT_TFJOB_RESTART_POLICY,
                        help="tfjob: restartPolicy when restart.max_restarts > 0 (default "
                        f"{DEFAULT_TFJOB_RESTART_POLICY}: only pods killed by a signal are "
                        "restarted; OnFailure: any failure)")
    export_trainjob.add_arguments(parser)
    parser.add_argument("cluster", metavar="CLUSTER.yaml")
    parser.add_argument("command", metavar="SCRIPT [ARGS...]", nargs=argparse.REMAINDER)
    return parser


def _tfjob_notes(manifest: dict[str, Any]) -> None:
    """What must be done besides `kubectl apply`, on stderr (also in the file's header)."""
    for command in tfjob_secret_commands(manifest):
        print(f"mgpu-launch export: secret-looking env values are read from a Secret; "
              f"create it first: {command}", file=sys.stderr)
    checkpoint_dir, claim = checkpoint_volume(manifest)
    if claim is None:
        print(f"mgpu-launch export: warning: no --pvc: {checkpoint_dir} is not shared by the "
              "pods and a restarted pod starts over", file=sys.stderr)


def _script_note(command: Sequence[str], image: str) -> str | None:
    """A script given by an absolute path that exists on this machine: the pods
    run that path in their image, where it is only if it was put there."""
    script = Path(command[0])
    if not script.is_absolute() or not script.exists():
        return None
    return (f"warning: the pods run {script}, a path on this machine: it is there only if "
            f"the image ({image}) holds the script at that path; copy it into the image and "
            "give its path in the image (absolute, or relative to the pods' working "
            "directory: an absolute `workdir:`, else the image's WORKDIR)")


def main(argv: Sequence[str]) -> int:
    """`argv[0]` is `export` (as dispatched by the CLI)."""
    args = _parser().parse_args(list(argv)[1:])
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("mgpu-launch export: no training script given", file=sys.stderr)
        return exits.USAGE
    try:
        loaded = load_config(args.cluster)
        if args.to == "slurm":
            name = Path(args.output).name if args.output else f"{loaded.config.name}.sbatch"
            text = slurm_script(loaded, command, port_base=args.port_base,
                                partition=args.partition, time_limit=args.time_limit,
                                output_name=name, nodes=args.nodes,
                                gpus_per_node=args.gpus_per_node)
        elif args.to == "trainjob":
            text, notes = export_trainjob.export_text(loaded, command, args, args.cluster)
            for note in notes:
                print(f"mgpu-launch export: {note}", file=sys.stderr)
        else:
            manifest = tfjob_manifest(loaded, command, image=args.image,
                                      checkpoint_dir=args.checkpoint_dir, pvc=args.pvc,
                                      namespace=args.namespace,
                                      restart_policy=args.restart_policy)
            policy = (tf_port_policy(manifest)
                      if loaded.config.security.tf_ports != "open" else None)
            text = render_tfjob(manifest, args.cluster, policy)
            _tfjob_notes(manifest)
    except ConfigError as exc:
        print(f"mgpu-launch: {exc}", file=sys.stderr)
        return exits.USAGE
    except (PlanError, ExportError) as exc:
        print(f"mgpu-launch export: {exc}", file=sys.stderr)
        return exits.USAGE
    note = None if args.to == "slurm" else _script_note(command, args.image)
    if note is not None:
        print(f"mgpu-launch export: {note}", file=sys.stderr)
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
    return exits.OK
