"""A slow shared filesystem for tests and benchmarks: a FUSE passthrough that
throttles reads and writes together to a given rate (a busy NFS server).

    python tests/slowfs.py SOURCE MOUNTPOINT MB_PER_S

runs in the foreground until unmounted (`fusermount3 -u MOUNTPOINT`) or
killed. Needs /dev/fuse, libfuse3 (Debian's fuse3) and mfusepy: `.ci/run`
installs them. `mounted(source, mountpoint, rate)` is the context manager
the tests use.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import threading
import time


def _operations():
    from mfusepy import FuseOSError, Operations

    class Throttled(Operations):
        """Every byte read or written waits its turn at `rate` bytes/s."""

        use_ns = True

        def __init__(self, root: str, rate: float) -> None:
            self.root = root
            self.rate = rate
            self._mutex = threading.Lock()  # not `lock`: the FUSE operation of that name
            self.free_at = time.monotonic()

        def _wait(self, size: int) -> None:
            with self._mutex:
                now = time.monotonic()
                self.free_at = max(self.free_at, now) + size / self.rate
                until = self.free_at
            time.sleep(max(0.0, until - time.monotonic()))

        def _p(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def access(self, path, amode):
            if not os.access(self._p(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path, mode):
            return os.chmod(self._p(path), mode)

        def chown(self, path, uid, gid):
            return os.chown(self._p(path), uid, gid)

        def create(self, path, mode, fi=None):
            return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

        def flush(self, path, fh):
            return 0

        def fsync(self, path, datasync, fh):
            return os.fdatasync(fh) if datasync else os.fsync(fh)

        def getattr(self, path, fh=None):
            st = os.lstat(self._p(path))
            return {key: getattr(st, key) for key in (
                "st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns", "st_nlink",
                "st_size", "st_uid", "st_ino")}

        def link(self, target, source):
            return os.link(self._p(source), self._p(target))

        def mkdir(self, path, mode):
            return os.mkdir(self._p(path), mode)

        def open(self, path, flags):
            return os.open(self._p(path), flags)

        def read(self, path, size, offset, fh):
            self._wait(size)
            return os.pread(fh, size, offset)

        def readdir(self, path, fh):
            return [".", "..", *os.listdir(self._p(path))]

        def readlink(self, path):
            return os.readlink(self._p(path))

        def release(self, path, fh):
            return os.close(fh)

        def rename(self, old, new):
            return os.rename(self._p(old), self._p(new))

        def rmdir(self, path):
            return os.rmdir(self._p(path))

        def statfs(self, path):
            st = os.statvfs(self._p(path))
            return {key: getattr(st, key) for key in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")}

        def symlink(self, target, source):
            return os.symlink(source, self._p(target))

        def truncate(self, path, length, fh=None):
            return os.truncate(self._p(path), length)

        def unlink(self, path):
            return os.unlink(self._p(path))

        def utimens(self, path, times=None):
            return os.utime(self._p(path), ns=times) if times else os.utime(self._p(path))

        def write(self, path, data, offset, fh):
            self._wait(len(data))
            return os.pwrite(fh, data, offset)

    return Throttled


def main(argv: list[str]) -> None:
    from mfusepy import FUSE

    source, mountpoint, rate = argv[0], argv[1], float(argv[2])
    FUSE(_operations()(os.path.abspath(source), rate * 1e6), mountpoint, foreground=True,
         nothreads=False, allow_other=True)


@contextlib.contextmanager
def mounted(source: str, mountpoint: str, mb_per_s: float):
    """`source` seen at `mountpoint` at `mb_per_s` MB/s, until the block ends."""
    os.makedirs(source, exist_ok=True)
    os.makedirs(mountpoint, exist_ok=True)
    # Its stderr to a file: a pipe nobody reads fills up, and the file system hangs.
    log = open(source.rstrip("/") + ".slowfs.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, __file__, source, mountpoint, str(mb_per_s)],
                            stderr=log)
    deadline = time.monotonic() + 20
    while not os.path.ismount(mountpoint):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            with open(log.name, "rb") as said:
                raise RuntimeError(f"slowfs did not mount: {said.read().decode()[-2000:]}")
        time.sleep(0.05)
    try:
        yield mountpoint
    finally:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=False)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


if __name__ == "__main__":
    main(sys.argv[1:])
