"""`mgpu-launch status RUN_DIR --watch`: the live table of a detached job,
redrawn from its run directory until it ends (launcher/outlets/status_watch.py).

A real detached launcher (`--detach --local 2`, a tiny script without
TensorFlow) and a real `status --watch` on a pseudo-terminal.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

from tests.conftest import PROGRESS_UNTIL_RELEASED, PYTHON, cli_env, run_cli

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class Terminal:
    """A process on a pseudo-terminal of 100 x 24 (or `size`), its screen output collected."""

    def __init__(self, args: list[str], cwd: Path, size: tuple[int, int] = (100, 24)) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        env = cli_env(TERM="xterm")
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen([PYTHON, "-m", "launcher", *args], cwd=cwd, env=env,
                                     stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        self.master = master
        self.raw = b""

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw.decode("utf-8", "replace"))

    def read_until(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.text):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out after {timeout} s waiting for {what}:\n{self.text}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.2))
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:  # EIO: the process ended and the terminal closed
                    chunk = b""
                if not chunk:
                    assert done(self.text), f"ended before {what}:\n{self.text}"
                    return
                self.raw += chunk

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def test_watch_redraws_a_detached_job_s_table_and_ends_with_it(workdir: Path):
    (workdir / "job.py").write_text(PROGRESS_UNTIL_RELEASED)
    release = workdir / "release"
    run_dir = workdir / "run"
    started = run_cli(["--detach", "--local", "2", "--run-dir", str(run_dir), "job.py",
                       str(release)], cwd=workdir, timeout=30)
    assert started.returncode == 0, started.stderr
    term = Terminal(["status", str(run_dir), "--watch"], cwd=workdir)
    # A terminal that says it is 0 x 0 (`script -qfc`, some CI consoles): plain lines.
    unsized = Terminal(["status", str(run_dir), "--watch"], cwd=workdir, size=(0, 0))
    try:
        rows = re.compile(r"host(\d)\s+worker\1\s+running\s+(\d+)\s+\d+\.\d+")

        def both_training(text: str) -> bool:
            return len({m.group(1) for m in rows.finditer(text) if int(m.group(2)) >= 2}) == 2

        term.read_until(both_training, 30, "both tasks running with steps and steps/s")
        assert re.search(r"HOST\s+TASK\s+STATE\s+STEP\s+STEPS/S", term.text)
        assert "generation 0 (0 restarts)" in term.text
        # The title says the goodput so far, as the launcher's own table does.
        term.read_until(lambda text: re.search(r"running ─+ goodput \d+ % ─", text), 30,
                        "the goodput in the title")
        unsized.read_until(lambda text: "host1/worker1 running" in text, 30,
                           "a plain line per task")
        assert "mgpu-launch | generation 0: host0/worker0 running" in unsized.text
        release.touch()
        term.read_until(lambda text: "summary:" in text, 30, "the job's end")
        assert term.proc.wait(timeout=10) == 0
        unsized.read_until(lambda text: "summary:" in text, 30, "the job's end (0 x 0)")
        assert "HOST" not in unsized.text.split("status:")[0]  # no table drawn
    finally:
        release.touch()
        term.close()
        unsized.close()
    assert re.search(r"status:\s+succeeded", term.text)
    assert re.search(r"host1/worker1\s+worker 1\s+succeeded", term.text)


def test_watch_refuses_what_is_not_a_run_directory(workdir: Path):
    result = run_cli(["status", str(workdir / "nothing"), "--watch"], cwd=workdir, timeout=30)
    assert result.returncode == 2
    assert "no such directory" in result.stderr and "Traceback" not in result.stderr
