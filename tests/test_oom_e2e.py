"""A task killed by the kernel's out-of-memory killer is said as that, from its
host's evidence (launcher/agent/evidence.py), not as "killed (SIGKILL: by a
user, or the OOM killer — check dmesg)": the job runs in a memory cgroup of
its own (256 MiB, as a container's or a Slurm job's limit), its one task
fills 1 GiB, the kernel kills it.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON, cli_env, read_summary, wait_for

pytestmark = pytest.mark.e2e

V1, V2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
LIMIT = 256 * 2**20
GREEDY = "print('filling memory', flush=True)\nhold = b'x' * (1 << 30)\nprint('not killed')\n"


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A memory cgroup of LIMIT bytes (v1's memory controller, or v2's), removed after."""
    if (V1 / "memory.limit_in_bytes").exists():
        folder, limit = V1 / f"mgpu-oom-{secrets.token_hex(3)}", "memory.limit_in_bytes"
    elif "memory" in (V2 / "cgroup.controllers").read_text(errors="replace").split():
        folder, limit = V2 / f"mgpu-oom-{secrets.token_hex(3)}", "memory.max"
    else:
        pytest.fail("no memory cgroup controller here (cgroup v1 memory or v2 memory): "
                    "the test needs root on a kernel with one")
    folder.mkdir()
    try:
        (folder / limit).write_text(str(LIMIT))
        yield folder
    finally:
        for pid in (folder / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), 9)
            except OSError:
                pass
        wait_for(lambda: not (folder / "cgroup.procs").read_text().split(), timeout=30,
                 what="the cgroup's processes to end")
        folder.rmdir()


def test_a_task_the_oom_killer_kills_is_said_so(memory_cgroup: Path, workdir: Path):
    (workdir / "greedy.py").write_text(GREEDY)
    run_dir = workdir / "run"
    # The launcher, its agent and the task in the cgroup, as on a limited host.
    enter = f"echo $$ > {memory_cgroup / 'cgroup.procs'} && exec \"$@\""
    done = subprocess.run(["sh", "-c", enter, "sh", PYTHON, "-m", "launcher", "--local", "1",
                           "--max-restarts", "0", "--no-live", "--run-dir", str(run_dir),
                           "greedy.py"], cwd=workdir, env=cli_env(), capture_output=True,
                          text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "not killed" not in output, output[-3000:]
    [failure] = read_summary(run_dir)["failures"]
    assert failure["kind"] == "oom", failure
    said = "killed by the kernel's out-of-memory killer: its memory cgroup's limit (256 MiB)"
    assert said in failure["description"] and said in output, output[-3000:]
    assert "check `dmesg`" not in output
