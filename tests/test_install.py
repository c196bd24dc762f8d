"""The install as README.md makes it, in a fresh venv of a copy of this checkout.

CI's own venv has every extra (jax included), so it cannot see what a new user
sees: here the README's quick-start install runs as written (the venv, the
activation, `pip install -e '.[examples]'`), then `mgpu-launch check` on
simulated hosts; and a light `pip install -e .` (no TensorFlow) runs `--local`,
which must stop at once and say what to install. pip's cache makes the
installs a download-free copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
INSTALL_TIMEOUT_S = 900


def quick_start() -> str:
    """The README's quick-start command line."""
    return next(line.strip() for line in README.read_text().splitlines()
                if line.startswith("python3 -m venv .venv"))


def clone(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and new, not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def shell(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if ".venv" not in p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.e2e
def test_the_readme_install_checks_simulated_hosts_without_jax(tmp_path):
    work = clone(tmp_path / "clone")
    install = quick_start().split(" && mgpu-launch ", 1)[0]
    assert "pip install -e '.[examples]'" in install, install
    done = shell(f"{install} -q\n"
                 "! python -c 'import jax' 2>/dev/null\n"  # as a new user has it: no jax
                 "mgpu-launch check cluster_configs/local.yaml", work, INSTALL_TIMEOUT_S)
    out = done.stdout + done.stderr
    assert "KeyError" not in out, out[-3000:]
    assert done.returncode == 0, out[-3000:]
    assert "verdict: ready" in done.stdout, out[-3000:]


@pytest.mark.e2e
def test_a_light_install_says_what_local_needs(tmp_path):
    work = clone(tmp_path / "clone")
    done = shell("python3 -m venv .venv && source .venv/bin/activate && pip install -q -e .\n"
                 "! python -c 'import tensorflow' 2>/dev/null\n"  # the launcher alone
                 "mgpu-launch --local 2 examples/digits/train.py", work, INSTALL_TIMEOUT_S)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "lacks tensorflow, scikit-learn" in done.stderr, done.stderr
    assert "pip install 'mgpu-launch[examples]'" in done.stderr, done.stderr
    assert "pip install -e '.[examples]'" in done.stderr, done.stderr
    assert not (work / "runs").exists()  # nothing started, nothing left behind
