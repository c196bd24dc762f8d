"""A host as the transports reach it (`HostTarget`), and where its agent keeps
the run's files (`host_run_dir`).

Apart from the plan (launcher.spec.plan, which makes them from the cluster
file) so that the transports import neither the cluster file's models nor
pydantic.

Must not import: config, plan, transport, supervisor, cli.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from . import rundir
from .transports import traits


@dataclass(frozen=True)
class HostTarget:
    """One machine (or simulated machine) and how to reach it."""

    name: str
    address: str
    python: str
    gpus: tuple[int, ...]
    ssh_user: str | None
    ssh_port: int
    identity_file: str | None
    known_hosts: str
    host_key_policy: str
    ssh_config_file: str | None
    connect_timeout_s: float


def host_run_dir(run_dir: str, transport: str, host: str) -> str:
    """Where the agent of `host` keeps its files (TF_CONFIG, error reports).

    Simulated hosts share this machine, so they live inside the run directory;
    a real host gets a private folder under its user's home (the agent expands
    the leading `~`), since the launcher's run directory is not on that host.
    """
    if traits(transport).simulated:
        return str(Path(run_dir) / rundir.HOSTS / host)
    # The run directory's name, and a digest of its full path: two jobs whose run
    # directories share a name (`--run-dir exp1` in two projects) must not share
    # pidfiles, or one job's agent would reap the other's tasks.
    return f"{_remote_runs_dir(run_dir)}/{host}"


@functools.lru_cache(maxsize=16)  # once per plan, not once per host
def _remote_runs_dir(run_dir: str) -> str:
    digest = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:8]
    return f"~/.mgpu-launch/runs/{Path(run_dir).name}-{digest}"
