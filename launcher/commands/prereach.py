"""A run's SSH hosts reached before its cluster file is validated.

A run validates its cluster file (pydantic and the file's models: ~0.1 s of
CPU at every start) before it knows how to reach the hosts, and the hosts'
logins wait for it. So every SSH run records how it reached them (the host
targets, the agents' lease, the job's name), under a digest of the cluster
file's bytes, in the user's cache (`remember`); the next run of the same file,
unchanged, starts those connections and agents from the record as its first
act (`start`, from launcher/__main__.py, before the launcher's modules load).
Once the file is validated the run command takes them (`take`) only where
the file gives exactly the recorded targets, lease and run directory; else
they are dropped (`drop`: an agent asked no task removes its folders, as
after any refused launch) and the hosts are reached as without it. A bad
file is still refused with its own error; the hosts it names were reached
with the values it gave the last time it was valid.

Only a plain run: `[options] CLUSTER.yaml [options] SCRIPT [args]`, its options among
`-q`, `-v`, `--no-live`, `--run-dir DIR` (a folder not there yet, or empty),
`--max-restarts N`, `--metrics-port PORT`; anything else (`--local`,
`--slurm`, `--dry-run`, `--detach`, a subcommand) starts nothing here.

The records: JSON (never code), one per cluster file path, in
`$XDG_CACHE_HOME/mgpu-launch/reach` (default `~/.cache/...`), the folder 0700
and each file 0600; read only when the folder and the file are the user's and
writable by nobody else. At most MAX_RECORDS: the oldest go.

Imports paramiko and the SSH transport, never pydantic or the cluster file's
models (tests/test_prereach.py checks it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..spec.rundir import why_unwritable

if TYPE_CHECKING:
    from ..spec.target import HostTarget
    from ..transport.ssh import SSHTransport

MAX_RECORDS = 64  # cluster files remembered; each a few hundred bytes per host
MAX_FILE_BYTES = 32 << 20  # a cluster file or a record past this is not read here
_FLAGS = frozenset({"-q", "--quiet", "-v", "--verbose", "--no-live"})
_WITH_VALUE = frozenset({"--run-dir", "--max-restarts", "--metrics-port"})


@dataclasses.dataclass
class _Early:
    transport: SSHTransport
    source: str  # the cluster file, resolved
    name: str  # the job's name the record gave (for the default run directory)
    run_dir: str
    targets: tuple[HostTarget, ...]
    lease: dict[str, float]
    taken: bool = False


_early: _Early | None = None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mgpu-launch" / "reach"


def start(argv: Sequence[str]) -> None:
    """A plain SSH run of a cluster file recorded unchanged: its hosts'
    connections and agents, started now (in threads)."""
    global _early
    plain = _plain_run(argv)
    if plain is None:
        return
    cluster, run_dir_arg, verbose = plain
    source = os.path.realpath(cluster)
    record = _read_record(source)
    if record is None:
        return
    name, targets, lease = record
    if run_dir_arg is not None:
        run_dir = os.path.realpath(run_dir_arg)  # as the run command's Path.resolve()
        if os.path.lexists(run_dir) and not _empty_folder(run_dir):
            return  # the run command says whether it may be used
    else:
        run_dir = default_run_dir(name)
    if why_unwritable(Path(run_dir)) is not None:
        return  # the run command refuses it, before any host
    from ..transport._paramiko import quiet_paramiko_logs
    from ..transport.ssh import from_config

    if not verbose:
        quiet_paramiko_logs()
    # SSH's own method, not the Transport protocol's (as in cli._reach_early).
    ssh = from_config(None, checking=False, lease=lease)
    ssh.warm(targets, run_dir)
    _early = _Early(ssh, source, name, run_dir, targets, lease)


def default_run_dir(name: str, now: float | None = None) -> str:
    """`runs/<name>-<timestamp>-<pid>`, resolved (the run command's default)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return os.path.realpath(os.path.join("runs", f"{name}-{stamp}-{os.getpid()}"))


def run_dir_for(source: Path | None, name: str) -> str | None:
    """The default run directory `start` chose for this file and job name, if any."""
    early = _early
    if early is None or source is None or os.path.realpath(source) != early.source \
            or early.name != name:
        return None
    return early.run_dir


def take(source: Path | None, name: str, targets: tuple[HostTarget, ...],
         lease: Mapping[str, float], run_dir: str) -> SSHTransport | None:
    """The transport `start` warmed, when the validated file gives exactly
    what it was started with; else None (and it is dropped)."""
    early = _early
    if early is None or early.taken:
        return None
    same = (source is not None and os.path.realpath(source) == early.source
            and (name, tuple(targets), dict(lease), run_dir)
            == (early.name, early.targets, early.lease, early.run_dir))
    if not same:
        drop()
        return None
    early.taken = True
    return early.transport


def drop() -> None:
    """What `start` began and nobody took: its connections closed, its agents
    told to go (each removes its folders)."""
    early = _early
    if early is not None and not early.taken:
        early.taken = True
        early.transport.abort()


def remember(source: Path | None, name: str, targets: tuple[HostTarget, ...],
             lease: Mapping[str, float]) -> None:
    """Record how this validated file's hosts are reached, for its next run."""
    if source is None:
        return
    resolved = os.path.realpath(source)
    digest = _file_digest(resolved)
    if digest is None:
        return
    if _early is not None and _early.source == resolved and _early.name == name \
            and _early.targets == tuple(targets) and _early.lease == dict(lease):
        return  # already what the record says
    record = {"version": __version__, "source": resolved, "digest": digest, "name": name,
              "lease": dict(lease), "targets": [dataclasses.asdict(t) for t in targets]}
    try:
        _write(_record_path(resolved), json.dumps(record).encode())
    except OSError:
        pass  # a read-only home: the next run reaches its hosts as without it


def _plain_run(argv: Sequence[str]) -> tuple[str, str | None, bool] | None:
    """(cluster file, --run-dir or None, -v given) of `[options] CLUSTER.yaml
    [options] SCRIPT ...` (the run command takes its options between the file
    and the script too: cli._options_first); None for any other command line."""
    seen: dict[str, Any] = {"run_dir": None, "verbose": False}
    index = _options(argv, 0, seen)
    if index is None or index >= len(argv) or not argv[index].endswith((".yaml", ".yml")):
        return None
    cluster = argv[index]
    index = _options(argv, index + 1, seen)
    if index is None or index >= len(argv):
        return None
    return cluster, seen["run_dir"], seen["verbose"]


def _options(argv: Sequence[str], index: int, seen: dict[str, Any]) -> int | None:
    """The index past the options of a plain run from `index` on, noting
    `--run-dir` (the last one wins, as in argparse) and `-v` in `seen`; None
    at an option a plain run does not have."""
    while index < len(argv) and argv[index].startswith("-"):
        option, equals, value = argv[index].partition("=")
        if option in _FLAGS and not equals:
            seen["verbose"] = seen["verbose"] or option in ("-v", "--verbose")
            index += 1
            continue
        if option not in _WITH_VALUE:
            return None
        if not equals:
            if index + 1 >= len(argv):
                return None
            value = argv[index + 1]
            index += 1
        index += 1
        if option == "--run-dir":
            seen["run_dir"] = value
    return index


def _empty_folder(path: str) -> bool:
    try:
        return os.path.isdir(path) and not os.listdir(path)
    except OSError:
        return False


def _record_path(source: str) -> Path:
    return cache_dir() / (hashlib.sha256(source.encode()).hexdigest()[:32] + ".json")


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest() if len(data) <= MAX_FILE_BYTES else None


def _read_record(source: str) -> tuple[str, tuple[HostTarget, ...], dict[str, float]] | None:
    """The record of this cluster file, if it is the user's alone and the file
    is unchanged since: (job name, targets, lease)."""
    folder = cache_dir()
    if not _private(folder, os.lstat):
        return None
    try:
        fd = os.open(_record_path(source), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not _private(fd, os.fstat):
            return None
        raw = handle.read(MAX_FILE_BYTES + 1)
    try:
        record = json.loads(raw)
        if (record["version"], record["source"]) != (__version__, source) \
                or record["digest"] != _file_digest(source):
            return None
        from ..spec.target import HostTarget

        targets = tuple(HostTarget(**{**t, "gpus": tuple(t["gpus"])}) for t in record["targets"])
        lease = {str(k): float(v) for k, v in record["lease"].items()}
        return str(record["name"]), targets, lease
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _private(what: Any, stat_of) -> bool:
    try:
        info = stat_of(what)
    except OSError:
        return False
    return info.st_uid == os.getuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _write(path: Path, data: bytes) -> None:
    """Atomically, 0600 in a 0700 folder; then the oldest records past MAX_RECORDS go."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(temp, path)
    records = []
    for record in path.parent.glob("*.json"):
        with contextlib.suppress(OSError):  # another launcher's pruning
            records.append((record.stat().st_mtime, record))
    for _, old in sorted(records)[:-MAX_RECORDS]:
        old.unlink(missing_ok=True)
