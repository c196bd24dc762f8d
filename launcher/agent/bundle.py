"""The agent's own code: where it runs from, checked at start, kept in use.

A bundle (launcher/transport/shipping.py) is a folder named
`<version>-<digest>` in a code cache, with a marker file; run from a source
tree (tests, development) there is no marker and nothing to check.

Standard library only; imports nothing of the launcher.
"""

from __future__ import annotations

import os

# launcher.transport.shipping.USE_MARKER (the agent imports no launcher code)
BUNDLE_MARKER = ".mgpu-bundle"
BUNDLE_TOUCH_EVERY_S = 3600.0
EXIT_UNSAFE = 96  # the run dir is not the user's alone, or the bundle is not what its name says
# The bundle's files, as launcher.transport.shipping lists them (kept in step by a test).
BUNDLE_FILES = ("launcher/__init__.py", "launcher/bootstrap.py",
                "launcher/netif.py", "launcher/outlines.py", "launcher/proctree.py",
                "launcher/standby.py", "launcher/firewall.py", "launcher/hostruns.py",
                "launcher/strategy.py", "launcher/nftlink.py", "launcher/fwregistry.py",
                "launcher/fwrules.py")
BUNDLE_DIRS = ("launcher/runtime", "launcher/agent")
# The folder that holds `launcher/`: this file is launcher/agent/bundle.py.
CODE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mark_used(code_dir: str = CODE_DIR) -> None:
    """Touch our bundle's folder: launchers drop bundles nobody used for a
    month (see launcher.transport.shipping). Only a bundle has the marker file."""
    if os.path.exists(os.path.join(code_dir, BUNDLE_MARKER)):
        try:
            os.utime(code_dir)
        except OSError:
            pass


def _sha256():
    """Python's own SHA-256 (a built-in module), imported here: only a bundle is
    checked. hashlib's would load OpenSSL first, ~1.5 ms more of every host's
    start than it saves on the bundle's ~450 KB (and the digest is the same)."""
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256  # Python 3.11
        except ImportError:  # a Python built without them
            from hashlib import sha256
    return sha256()


def unsafe_start(code_dir: str, run_dir: str) -> str:
    """Why this agent must not start tasks ("" when it may): its host run
    directory must be the user's alone (TF_CONFIG and error reports live there),
    and a bundle's content must match the digest in its folder's name."""
    info = os.stat(run_dir)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        return (f"the run directory {run_dir} belongs to uid {info.st_uid} with mode "
                f"{info.st_mode & 0o777:o}: it must be yours and writable by nobody else")
    if not os.path.exists(os.path.join(code_dir, BUNDLE_MARKER)):
        return ""  # run from a source tree (tests, development), not from a bundle
    digest = _sha256()
    paths = list(BUNDLE_FILES)
    for folder in BUNDLE_DIRS:
        paths += sorted(f"{folder}/{name}" for name in os.listdir(os.path.join(code_dir, folder))
                        if name.endswith(".py"))
    for path in sorted(paths):
        with open(os.path.join(code_dir, path), "rb") as handle:
            digest.update(path.encode() + b"\0" + handle.read() + b"\0")
    expected = os.path.basename(code_dir).rsplit("-", 1)[-1]
    if digest.hexdigest()[:len(expected)] != expected:
        return (f"the code in {code_dir} does not match the digest in its name: changed "
                "after it was installed; remove that folder (the next launch reinstalls it)")
    return ""
