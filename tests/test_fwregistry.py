"""The firewall's registry (launcher/fwregistry.py): one folder per machine and
network namespace, so that on hosts sharing a home folder an agent reads its own
machine's entries only; an older version's flat entries are still swept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import fwregistry


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def _entry(folder: Path, table: str, pid: int, start: int | None = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{table}.json"
    here = fwregistry._here()
    path.write_text(json.dumps({**here, "pid": pid, "start": start,
                                "record": {"table": table, "backend": "nft"}}))
    return path


def test_an_agents_entry_is_private_and_in_its_machines_folder(home):
    fwregistry.register("mgpu_job_a", "/runs/a", {"table": "mgpu_job_a", "backend": "nft"})
    folder = Path(fwregistry.folder())
    assert folder.parent == home / ".mgpu-launch" / "firewall"
    namespace = "".join(c for c in os.readlink("/proc/self/ns/net") if c.isdigit())
    assert folder.name.endswith(f".{namespace}")  # and the machine's name before it
    entry = json.loads((folder / "mgpu_job_a.json").read_text())
    assert entry["pid"] == os.getpid() and entry["run_dir"] == "/runs/a"
    assert (folder / "mgpu_job_a.json").stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    # Its agent (this process) runs: not gone.
    assert fwregistry.gone() == []
    fwregistry.unregister("mgpu_job_a")
    assert not (folder / "mgpu_job_a.json").exists()


def test_only_this_machines_and_an_older_versions_entries_are_listed(home):
    dead = _dead_pid()
    root, mine = Path(fwregistry.root()), Path(fwregistry.folder())
    own = _entry(mine, "mgpu_own", dead)
    legacy = _entry(root, "mgpu_legacy", dead)  # an older version kept all hosts in one folder
    # Another host of a shared home folder: its entries are never read. (This one
    # even claims to be ours: before, every host's entries were read, N x N.)
    _entry(root / "otherhost.4026531840", "mgpu_other", dead)
    _entry(mine, "mgpu_running", os.getpid(), fwregistry._start_time(os.getpid()))  # runs
    assert sorted(path for path, _pid, _record in fwregistry.gone()) == sorted(
        [str(own), str(legacy)])
    fwregistry.unregister("mgpu_legacy")
    assert not legacy.exists()


def test_the_nft_lock_is_per_machine(home):
    fd = fwregistry.lock_file()
    assert fd is not None
    os.close(fd)
    assert (Path(fwregistry.folder()) / "nft.lock").exists()
