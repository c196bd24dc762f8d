"""The code a host needs: the agent, the bootstrap and the runtime.

Owns: which files make up the host bundle, its content digest (the cache key),
installing it into a local cache directory, and which old bundles a cache may
drop. The SSH transport uploads the same files over SFTP; the local transport
copies them; both then run the very same agent from the cache, never from the
launcher's own installation.

Every launcher version (and every change of a shipped file) makes a new
bundle, so caches would only grow: each bundle carries a `USE_MARKER` file,
the agent touches its bundle folder when it starts, when it starts a task and
every hour, and whoever installs a new bundle drops the ones nobody used in
`UNUSED_FOR_S` (bundles of versions before the marker count from their
upload). A dropped bundle costs nothing but a re-upload next time.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from .. import __version__

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # launcher/
# Relative to the package's parent. Standard library only, all of them.
BUNDLE = ("launcher/__init__.py", "launcher/bootstrap.py",
          "launcher/netif.py", "launcher/outlines.py", "launcher/proctree.py",
          "launcher/standby.py", "launcher/firewall.py", "launcher/hostruns.py",
          "launcher/strategy.py", "launcher/nftlink.py", "launcher/fwregistry.py",
          "launcher/fwrules.py")
BUNDLE_DIRS = ("launcher/runtime", "launcher/agent")
# A complete bundle has it: the file `python -m launcher.agent` runs.
AGENT_MAIN = "launcher/agent/__main__.py"
USE_MARKER = ".mgpu-bundle"  # in a bundle's folder: the agent touches the folder
UNUSED_FOR_S = 30 * 86400.0
STAGING_STALE_S = 86400.0  # a staging folder this old is what a crashed upload left
_BUNDLE_NAME = re.compile(r"\d[\w.+]*-[0-9a-f]{12}")


# Every host's connection thread asks for the bundle at once: without the lock
# each of them read and hashed it before the first call's result was cached
# (at 32 SSH hosts 0.22 s of the launcher's CPU under a profiler, during the logins).
_computing = threading.Lock()


def bundle_files() -> tuple[tuple[str, bytes], ...]:
    """(relative path, content) of every file shipped to hosts, sorted."""
    with _computing:
        return _bundle_files()


def bundle_id() -> str:
    """`<version>-<digest>`: a new directory whenever any shipped byte changes."""
    with _computing:
        return _bundle_id()


@cache
def _bundle_files() -> tuple[tuple[str, bytes], ...]:
    root = PACKAGE_DIR.parent
    paths = list(BUNDLE)
    for folder in BUNDLE_DIRS:
        paths += sorted(str(p.relative_to(root)) for p in (root / folder).glob("*.py"))
    return tuple((p, (root / p).read_bytes()) for p in sorted(paths))


@cache
def _bundle_id() -> str:
    digest = hashlib.sha256()
    for path, content in _bundle_files():
        digest.update(path.encode() + b"\0" + content + b"\0")
    return f"{__version__}-{digest.hexdigest()[:12]}"


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "mgpu-launch" / "code"


def stale_bundles(entries: Iterable[tuple[str, float]], keep: str, now: float) -> list[str]:
    """Names in a cache folder to delete, from its (name, mtime) entries.

    Bundles (`<version>-<digest>`) unused for `UNUSED_FOR_S`, and staging
    folders older than `STAGING_STALE_S`; never `keep`, never anything else.
    """
    def too_old(name: str, age: float) -> bool:
        if name.startswith(".staging-"):
            return age > STAGING_STALE_S
        return bool(_BUNDLE_NAME.fullmatch(name)) and age > UNUSED_FOR_S

    return sorted(name for name, mtime in entries
                  if name != keep and too_old(name, now - mtime))


def prune_local(cache_root: Path, keep: str) -> list[str]:
    """Drop stale bundles from a local cache (best effort); return their names."""
    try:
        entries = [(e.name, e.stat().st_mtime) for e in os.scandir(cache_root) if e.is_dir()]
    except OSError:
        return []
    stale = stale_bundles(entries, keep, time.time())
    for name in stale:
        try:
            # Renamed first: a half-deleted bundle never stays under its name.
            doomed = cache_root / name
            if not name.startswith(".staging-"):
                doomed = doomed.rename(cache_root / f".staging-{secrets.token_hex(6)}")
            shutil.rmtree(doomed, ignore_errors=True)
        except OSError:
            continue  # another launcher is pruning it
    return stale


class UnsafeCache(Exception):
    """A code cache someone else could write to: its code is never run."""


def check_private(path: Path, recursive: bool = False) -> None:
    """`path` (and, `recursive`, all below it) must be owned by this user and
    writable by nobody else: the agent and every task run the code in it (an
    XDG_CACHE_HOME on a shared /tmp would otherwise let another user plant it)."""
    entries = [path]
    if recursive:
        entries += sorted(path.rglob("*"))
    for entry in entries:
        info = entry.lstat()
        if info.st_uid != os.geteuid():
            raise UnsafeCache(f"the code cache {entry} belongs to uid {info.st_uid}, not to "
                              f"you (uid {os.geteuid()}): remove it, or set XDG_CACHE_HOME "
                              "to a folder of your own")
        if info.st_mode & 0o022:
            raise UnsafeCache(f"the code cache {entry} is writable by others (mode "
                              f"{info.st_mode & 0o777:o}): `chmod go-w` it, or remove it")


def install_local(cache_root: Path | None = None) -> Path:
    """Copy the bundle into `<cache_root>/<bundle_id>` once; return that directory.

    Written to a temporary sibling and renamed, so a half-written bundle is
    never used even when two launchers race. Raises UnsafeCache when the cache
    (or the bundle in it) is another user's or writable by others.
    """
    root = cache_root or default_cache_root()
    target = root / bundle_id()
    if (target / AGENT_MAIN).exists():
        for folder in (root.parent, root):
            check_private(folder)
        check_private(target, recursive=True)
        return target
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in (root.parent, root):
        check_private(folder)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for relative, content in bundle_files():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.write_bytes(content)
            os.chmod(path, 0o600)  # whatever the umask: check_private reads the modes
        (staging / USE_MARKER).write_bytes(b"")
        os.chmod(staging / USE_MARKER, 0o600)
        for folder in staging.rglob("*"):
            if folder.is_dir():
                os.chmod(folder, 0o700)
        try:
            os.rename(staging, target)
        except OSError:  # another launcher won the race
            if not (target / AGENT_MAIN).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    prune_local(root, keep=target.name)
    return target
