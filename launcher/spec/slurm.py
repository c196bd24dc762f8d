"""Slurm, the batch system of `transport: slurm` and `mgpu-launch --slurm`:
its allocation's nodes (in Slurm's order) and their GPUs, read from the
environment Slurm sets inside an allocation (`salloc`, an `sbatch` script),
and what Slurm says of its job (its state, why it stopped). `SYSTEM` is its
row of the batch systems (launcher/spec/allocation.py: `BatchSystem`); a host
`address: slurm:N` is the allocation's N-th node counted from 0 (what `export
--to slurm` writes, since a batch script cannot know its nodes' names).

Must not import: plan, transport, supervisor, cli.
"""

from __future__ import annotations

import shutil
import subprocess
import zlib
from collections.abc import Callable, Mapping

from .allocation import Allocation, AllocationError, BatchSystem

# Ports for `ports.base: auto` under Slurm: the launcher cannot probe the
# nodes, so each job gets its own stretch of this range (from its job id),
# which keeps two jobs sharing a node apart most of the time. Below Linux's
# default ephemeral range (32768-60999), from which every outgoing connection
# takes its source port: a base there could be taken before TensorFlow binds
# it ("Could not start gRPC server"; launcher/transport/ports.py). The last
# stretch ends at 32767.
AUTO_PORT_FIRST, AUTO_PORT_SPAN, AUTO_PORT_STRIDE = 12288, 20480, 64
NODE_BY_POSITION = "slurm:"  # `address: slurm:0` is the allocation's first node (SYSTEM.name)


class SlurmError(AllocationError):
    """Not inside a usable Slurm allocation; the message says what to do."""


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


def _scontrol_hostnames(nodelist: str) -> list[str] | None:
    if not shutil.which("scontrol"):
        return None
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.split() if done.returncode == 0 and done.stdout.split() else None


def _gpus(environ: Mapping[str, str]) -> tuple[int, ...]:
    """GPUs per node as the allocation reports them: a count, numbered from 0.

    SLURM_GPUS_ON_NODE counts them; SLURM_JOB_GPUS lists the batch node's global
    ids, then SLURM_GPUS_PER_NODE, then CUDA_VISIBLE_DEVICES in a batch script;
    only the count is used: with ConstrainDevices (cgroups) a
    step sees its GPUs as 0..N-1, whatever their global ids.
    """
    count = environ.get("SLURM_GPUS_ON_NODE", "")
    if count.isdigit():
        return tuple(range(int(count)))
    listed = [g for g in environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip()]
    if listed:
        return tuple(range(len(listed)))
    per_node = environ.get("SLURM_GPUS_PER_NODE", "").rsplit(":", 1)[-1]
    if per_node.isdigit():
        return tuple(range(int(per_node)))
    # Inside the job (an sbatch script) Slurm sets the devices of this node.
    visible = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if g.strip().isdigit() or g.strip().startswith(("GPU-", "MIG-"))]  # not "-1"
    return tuple(range(len(visible))) if "SLURMD_NODENAME" in environ else ()


def read_allocation(environ: Mapping[str, str],
                    hostnames: Callable[[str], list[str] | None] = _scontrol_hostnames
                    ) -> Allocation:
    """The allocation this process runs in. Raises SlurmError outside one."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not job_id or not nodelist:
        raise SlurmError(
            "not inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set): "
            "run it under `salloc -N2 mgpu-launch --slurm train.py`, or from an sbatch script "
            "(`mgpu-launch export --to slurm` writes one)")
    nodes = hostnames(nodelist) or expand_hostlist(nodelist)
    return Allocation(job_id=job_id, nodes=tuple(nodes), gpus=_gpus(environ))


# States of a job whose nodes are still ours (squeue's long names).
_LIVE_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "RESIZING", "SIGNALING",
                          "STAGE_OUT"})


def job_state(job_id: str) -> str | None:
    """Slurm's JobState of `job_id` (RUNNING, CANCELLED, TIMEOUT, ...); "GONE"
    when Slurm no longer knows it; None when Slurm cannot be asked."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return "GONE" if "invalid job id" in done.stderr.lower() else None
    for field in done.stdout.split():
        if field.startswith("JobState="):
            return field.removeprefix("JobState=")
    return None


def allocation_ended(job_id: str) -> bool:
    """True when Slurm says job `job_id` is over (cancelled, timed out, gone);
    False while it runs, or when Slurm cannot be asked."""
    state = job_state(job_id)
    return state is not None and state not in _LIVE_STATES


def why_stopped(job_id: str) -> str:
    """Why a job in this allocation got SIGTERM, in words for the summary."""
    state = job_state(job_id)
    if state == "CANCELLED":
        return f"the Slurm job {job_id} was cancelled (scancel)"
    if state in ("TIMEOUT", "DEADLINE"):
        return f"the Slurm job {job_id} reached its time limit"
    if state == "PREEMPTED":
        return f"the Slurm job {job_id} was preempted"
    if state is not None and state not in _LIVE_STATES:
        return (f"the Slurm job {job_id} ended ({state}: scancel, its time limit or "
                "preemption)")
    return (f"SIGTERM while the Slurm job {job_id} runs: its time limit is near (the "
            "script's --signal), or someone stopped the launcher")


def auto_port_base(job_id: str) -> int:
    return AUTO_PORT_FIRST + (zlib.crc32(job_id.encode()) * AUTO_PORT_STRIDE) % AUTO_PORT_SPAN


SYSTEM = BatchSystem(
    name="slurm", title="Slurm",
    read=read_allocation, ended=allocation_ended, why_stopped=why_stopped,
    auto_port_base=auto_port_base,
    more_nodes=lambda count: f"`--nodes={count}`",
    option_help="run on the nodes of the Slurm allocation this runs in (salloc, sbatch), "
                "one worker per node (no YAML needed)")
