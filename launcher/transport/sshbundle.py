"""The agent's bundle on an SSH host: the command that runs it from the
host's cache (`agent_command`: checked before any of its code runs) and the
upload into that cache over SFTP (`upload_bundle`, `prune_remote`).

Security: every value reaching the remote shell is shlex-quoted; the bundle
is 0700/0600, written into a staging folder and renamed (never half there),
and run only when every file of it is the user's alone.

Must not import: supervisor, cli.
"""

from __future__ import annotations

import contextlib
import io
import json
import posixpath
import secrets
import shlex
import stat
import time

from ._paramiko import paramiko
from .child import DEFAULT_LEASE_S
from .shipping import AGENT_MAIN, USE_MARKER, bundle_files, stale_bundles

EXIT_BUNDLE_MISSING = 98  # our probe's exit code: the cache has no bundle of this version
EXIT_UNSAFE_CACHE = 97  # the cache (or the bundle in it) is another user's or writable by others


# Run by the remote shell as `python -S -c`, before any code of the cache:
# the bundle must be there (else exit 98) and the cache folders and every file
# of the bundle this user's and writable by nobody else (else exit 97, naming
# them), then the agent runs from it as `python -S -m launcher.agent` would.
# In the interpreter the agent needs anyway: no `find`, `id` or subshell per
# login (each a process the login pays for, 32 hosts at once on a fan-out).
# Its first argument is the module's name, for `ps`; the agent's own follow.
_AGENT_MAIN = """import os,sys
b=%(home)s or os.environ.get("HOME","")
c=b+"/"+%(cache)s
if not os.path.isfile(c+"/"+%(agent_main)s):
    sys.stderr.write("no bundle; HOME="+os.environ.get("HOME","")+"\\n");sys.exit(%(missing)d)
u=os.getuid();bad=[]
def chk(p):
    try:
        s=os.lstat(p)
        if s.st_uid!=u or s.st_mode&0o22:bad.append(p)
    except OSError as e:bad.append(str(e))
for p in [b+"/"+q for q in %(parents)s]+[c]:chk(p)
for d,ds,fs in os.walk(c,onerror=lambda e:bad.append(str(e))):
    for n in ds+fs:chk(d+"/"+n)
if bad:
    sys.stderr.write("not yours alone: "+" ".join(bad[:3])+"\\n");sys.exit(%(unsafe)d)
os.environ["PYTHONPATH"]=c;sys.path.insert(0,c);sys.argv[:2]=[c+"/"+%(agent_main)s]
from launcher.agent.__main__ import run
run()
"""


def agent_command(python: str, cache: str, host: str, run_dir: str, eof_grace_s: float,
                  lease_s: float = DEFAULT_LEASE_S, home: str | None = None) -> str:
    """The remote command: run the cached agent, or exit 98 when the cache lacks it
    (97 when someone else could have written to it: `_AGENT_MAIN`).

    `exec`, so the interpreter replaces the remote shell. That shell still reads
    the user's rc file first (Debian's bash sources ~/.bashrc for any command sshd
    runs; a pyenv init there costs ~0.1 s of CPU per host): no client can
    avoid it, so the agent keeps its own start light instead (`python -S`,
    nothing else started by the shell).
    The cache is under `home` when given (the SFTP session's home, where the
    bundle was uploaded), else under `$HOME` as the interpreter sees it;
    every value is quoted. `run_dir` may start with `~/`: the agent expands
    it. On exit 98 it says its $HOME.
    """
    root = posixpath.dirname(cache.rstrip("/"))
    parents = [p for p in (posixpath.dirname(root), root) if p]
    main = _AGENT_MAIN % {"home": json.dumps(home or ""), "cache": json.dumps(cache),
                          "parents": json.dumps(parents), "agent_main": json.dumps(AGENT_MAIN),
                          "missing": EXIT_BUNDLE_MISSING, "unsafe": EXIT_UNSAFE_CACHE}
    # `launcher.agent` stays on its command line (ps, `pgrep -f launcher.agent`).
    return (f"exec {shlex.quote(python)} -S -c {shlex.quote(main)} launcher.agent "
            f"--host {shlex.quote(host)} --run-dir {shlex.quote(run_dir)} "
            f"--eof-grace {float(eof_grace_s):g} --lease {float(lease_s):g}")


def upload_bundle(sftp: paramiko.SFTPClient, cache_root: str, version: str) -> None:
    """Put the bundle into `<cache_root>/<version>` (0700 dirs, 0600 files), atomically.

    Written into a staging directory and renamed, so a half-written bundle is
    never used, even when two launchers upload at once.
    """
    root = ""
    for part in cache_root.split("/"):
        root = f"{root}/{part}" if root else part
        try:
            sftp.stat(root)
        except FileNotFoundError:
            with contextlib.suppress(OSError):  # a racing launcher made it
                sftp.mkdir(root, 0o700)
    target = f"{cache_root}/{version}"
    staging = f"{cache_root}/.staging-{secrets.token_hex(6)}"
    sftp.mkdir(staging, 0o700)
    made = {staging}
    try:
        for relative, content in bundle_files():
            folder = staging
            for part in relative.split("/")[:-1]:
                folder = f"{folder}/{part}"
                if folder not in made:
                    sftp.mkdir(folder, 0o700)
                    made.add(folder)
            path = f"{staging}/{relative}"
            sftp.putfo(io.BytesIO(content), path, confirm=False)
            sftp.chmod(path, 0o600)
        sftp.putfo(io.BytesIO(b""), f"{staging}/{USE_MARKER}", confirm=False)
        sftp.chmod(f"{staging}/{USE_MARKER}", 0o600)
        try:
            sftp.rename(staging, target)
        except OSError:
            sftp.stat(f"{target}/{AGENT_MAIN}")  # another launcher won: fine
            _remove_tree(sftp, staging)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove_tree(sftp, staging)
        raise
    prune_remote(sftp, cache_root, keep=version)


def prune_remote(sftp: paramiko.SFTPClient, cache_root: str, keep: str) -> list[str]:
    """Drop the host's stale bundles (launcher.transport.shipping.stale_bundles), best effort."""
    try:
        entries = [(e.filename, float(e.st_mtime or 0)) for e in sftp.listdir_attr(cache_root)
                   if e.st_mode is not None and stat.S_ISDIR(e.st_mode)]  # no symlinks
    except OSError:
        return []
    stale = stale_bundles(entries, keep, time.time())
    for name in stale:
        with contextlib.suppress(OSError):  # e.g. another launcher is pruning it
            doomed = f"{cache_root}/{name}"
            if not name.startswith(".staging-"):
                # Renamed first: a half-deleted bundle never stays under its name.
                gone = f"{cache_root}/.staging-{secrets.token_hex(6)}"
                sftp.rename(doomed, gone)
                doomed = gone
            _remove_tree(sftp, doomed)
    return stale


def _remove_tree(sftp: paramiko.SFTPClient, path: str) -> None:
    for entry in sftp.listdir_attr(path):
        child = f"{path}/{entry.filename}"
        if entry.st_mode is not None and (entry.st_mode & 0o170000) == 0o040000:
            _remove_tree(sftp, child)
        else:
            sftp.remove(child)
    sftp.rmdir(path)
