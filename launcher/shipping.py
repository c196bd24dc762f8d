"""The code a host needs: the agent, the bootstrap and the runtime.

Owns: which files make up the host bundle, its content digest (the cache key),
and installing it into a local cache directory. The SSH transport uploads the
same files over SFTP; the local transport copies them; both then run the very
same agent from the cache, never from the launcher's own installation.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from functools import cache
from pathlib import Path

from . import __version__

PACKAGE_DIR = Path(__file__).resolve().parent
# Relative to the package's parent. Standard library only, all of them.
BUNDLE = ("launcher/__init__.py", "launcher/agent.py", "launcher/bootstrap.py")
BUNDLE_DIRS = ("launcher/runtime",)


@cache
def bundle_files() -> tuple[tuple[str, bytes], ...]:
    """(relative path, content) of every file shipped to hosts, sorted."""
    root = PACKAGE_DIR.parent
    paths = list(BUNDLE)
    for folder in BUNDLE_DIRS:
        paths += sorted(str(p.relative_to(root)) for p in (root / folder).glob("*.py"))
    return tuple((p, (root / p).read_bytes()) for p in sorted(paths))


@cache
def bundle_id() -> str:
    """`<version>-<digest>`: a new directory whenever any shipped byte changes."""
    digest = hashlib.sha256()
    for path, content in bundle_files():
        digest.update(path.encode() + b"\0" + content + b"\0")
    return f"{__version__}-{digest.hexdigest()[:12]}"


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "mgpu-launch" / "code"


def install_local(cache_root: Path | None = None) -> Path:
    """Copy the bundle into `<cache_root>/<bundle_id>` once; return that directory.

    Written to a temporary sibling and renamed, so a half-written bundle is
    never used even when two launchers race.
    """
    root = cache_root or default_cache_root()
    target = root / bundle_id()
    if (target / "launcher" / "agent.py").exists():
        return target
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    try:
        for relative, content in bundle_files():
            path = staging / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        try:
            os.rename(staging, target)
        except OSError:  # another launcher won the race
            if not (target / "launcher" / "agent.py").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
