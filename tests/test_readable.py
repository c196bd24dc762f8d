"""A checkpoint that cannot be read is passed over for the newest that reads
(launcher/runtime/readable.py), in real task processes as the agent starts
them (`python -m launcher.bootstrap`, a progress channel): real TensorFlow
checkpoints, really damaged (a data file cut to half, a byte flipped, a file
gone). The launcher's side and a whole job: tests/test_damaged_checkpoint_e2e.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, SCRIPTS

PROBE = str(SCRIPTS / "ckpt_probe.py")
DATA = ".data-00000-of-00001"


def start(tmp_path: Path, *args: str, tf_config: str = "",
          **more: str) -> tuple[subprocess.Popen, int]:
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, MGPU_PROGRESS_FD=str(write_fd), MGPU_GENERATION="1",
               PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2", **more)
    env.pop("TF_CONFIG", None)
    if tf_config:
        env["TF_CONFIG"] = tf_config
    proc = subprocess.Popen([sys.executable, "-m", "launcher.bootstrap", PROBE, *args],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, pass_fds=(write_fd,))
    os.close(write_fd)
    return proc, read_fd


def finish(proc: subprocess.Popen, read_fd: int) -> tuple[int, str, list[dict], dict | None]:
    """(exit code, output, progress records, what it restored)."""
    with os.fdopen(read_fd) as channel:
        records = [json.loads(line) for line in channel]
    output, _ = proc.communicate(timeout=120)
    restored = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines()
                if line.startswith("RESTORED ")]
    return proc.returncode, output, records, restored[0] if restored else None


def run(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, list[dict], dict | None]:
    return finish(*start(tmp_path, *args, **env))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Callable[[int], Path]:
    """Checkpoint directories of `count` saves, each made once for the module
    (a TensorFlow process each): the tests damage copies of them."""
    folders: dict[int, Path] = {}

    def make(count: int) -> Path:
        if count not in folders:
            where = tmp_path_factory.mktemp(f"saved{count}")
            code, output, _, _ = run(where, "save", str(where / "ckpt"), str(count))
            assert code == 0, output[-3000:]
            folders[count] = where / "ckpt"
        return folders[count]

    return make


@pytest.fixture
def saved(made, tmp_path) -> Callable[[Path, int], Path]:
    def copy(_tmp_path: Path, count: int) -> Path:
        directory = tmp_path / "ckpt"
        shutil.copytree(made(count), directory)
        return directory

    return copy


def tear(path: Path) -> None:
    """A torn write: the file cut to half its size."""
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def state(directory: Path) -> str:
    return (directory / "checkpoint").read_text()


def passed_over(records: list[dict]) -> list[tuple[str, str]]:
    return [(os.path.basename(r["passed_over"]), r["passed_over_why"]) for r in records
            if "passed_over" in r]


def test_a_torn_newest_checkpoint_is_passed_over_kept_aside_and_never_overwritten(tmp_path, saved):
    directory = saved(tmp_path, 4)  # ckpt-2, ckpt-3, ckpt-4 kept
    torn = directory / f"ckpt-4{DATA}"
    tear(torn)
    size = torn.stat().st_size
    code, output, records, restored = run(tmp_path, "manager", str(directory), "save")
    assert code == 0, output[-3000:]
    assert restored == {"step": 30, "latest": str(directory / "ckpt-3")}, output[-3000:]
    [(name, why)] = passed_over(records)
    assert name == "ckpt-4" and "shorter than its index" in why, records
    [record] = [r for r in records if "passed_over" in r]
    assert record["passed_over_for"] == str(directory / "ckpt-3")
    kept = Path(record["passed_over_to"])
    assert kept.parent == directory / "damaged" and kept.name.startswith("ckpt-4-"), kept
    # Kept whole, as it was: its data file (torn) and its index.
    assert (kept / f"ckpt-4{DATA}").stat().st_size == size
    assert (kept / "ckpt-4.index").exists()
    # The save after the restore took the name ckpt-4 again, beside, not over it.
    assert 'model_checkpoint_path: "ckpt-4"' in state(directory)
    assert (directory / f"ckpt-4{DATA}").stat().st_size > size
    assert (kept / f"ckpt-4{DATA}").stat().st_size == size
    assert [r["resumed"] for r in records if "resumed" in r] == [30], records
    assert "cannot be read" in output and str(kept) in output


@pytest.mark.parametrize("sentinel", ["on", "off"])
def test_a_newest_checkpoint_holding_nan_is_passed_over_unless_the_sentinel_is_off(
        tmp_path, sentinel):
    """Saved without the launcher (a run before it, or one with no save check):
    the newest checkpoint's kernel holds a NaN. A restore takes the one before,
    keeping the NaN one aside; `sentinel: off` restores what the script asked."""
    directory = tmp_path / "ckpt"
    made = subprocess.run([sys.executable, PROBE, "save", str(directory), "4", "nan"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert made.returncode == 0, made.stderr[-3000:]
    code, output, records, restored = run(tmp_path, "manager", str(directory),
                                          MGPU_SENTINEL=sentinel)
    assert code == 0, output[-3000:]
    if sentinel == "off":
        assert restored == {"step": 40, "latest": str(directory / "ckpt-4")}, output[-3000:]
        assert not passed_over(records)
        return
    assert restored == {"step": 30, "latest": str(directory / "ckpt-3")}, output[-3000:]
    [(name, why)] = passed_over(records)
    assert name == "ckpt-4" and "holds NaN" in why, why  # named by its checkpoint key
    [kept] = (directory / "damaged").iterdir()
    assert (kept / f"ckpt-4{DATA}").exists() and (kept / "ckpt-4.index").exists()
    assert 'model_checkpoint_path: "ckpt-3"' in state(directory)


def test_a_restore_of_tf_train_latest_checkpoint_passes_over_each_damaged_one(tmp_path, saved):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    data = bytearray((directory / f"ckpt-3{DATA}").read_bytes())
    data[len(data) // 2] ^= 0xFF  # a byte flipped: its checksum does not match
    (directory / f"ckpt-3{DATA}").write_bytes(bytes(data))
    code, output, records, restored = run(tmp_path, "latest", str(directory))
    assert code == 0, output[-3000:]
    assert restored["step"] == 20, output[-3000:]
    said = passed_over(records)
    assert [name for name, _ in said] == ["ckpt-4", "ckpt-3"], said
    assert "checksum does not match" in said[1][1], said
    text = state(directory)
    assert 'model_checkpoint_path: "ckpt-2"' in text and "ckpt-3" not in text, text
    assert sorted(p.name for p in (directory / "damaged").iterdir()) \
        == sorted(p.name for p in (directory / "damaged").glob("ckpt-[34]-*")), output


def test_with_no_readable_checkpoint_left_it_stops_saying_so_and_moves_nothing(tmp_path, saved):
    directory = saved(tmp_path, 3)  # ckpt-1, ckpt-2, ckpt-3
    tear(directory / f"ckpt-3{DATA}")
    os.remove(directory / f"ckpt-2{DATA}")
    (directory / "ckpt-1.index").write_bytes(b"not an index")
    before = sorted(os.listdir(directory)), state(directory)
    code, output, records, restored = run(tmp_path, "manager", str(directory))
    assert code != 0 and restored is None, output[-3000:]
    assert "NoReadableCheckpoint" in output, output[-3000:]
    assert f"no checkpoint in {directory} can be read" in output
    assert "ckpt-2: its data file is missing" in output
    assert "ckpt-1: its index cannot be read" in output
    assert (sorted(os.listdir(directory)), state(directory)) == before
    assert not passed_over(records)


def test_two_workers_restoring_at_once_agree_and_only_the_chief_moves_files(tmp_path, saved):
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    os.remove(directory / f"ckpt-3{DATA}")
    cluster = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}  # worker 0: the chief
    started, early = {}, []
    for i in (1, 0):  # worker 1 first: it sees the damaged state and waits for the chief
        started[i] = start(tmp_path, "manager", str(directory), tf_config=json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": i}}))
        for line in iter(started[i][0].stdout.readline, "") if i == 1 else ():
            early.append(line)  # to its wait (or its end, had it moved the files itself)
            if "for the chief to pass it over" in line:
                break
    results = [finish(*started[i]) for i in (0, 1)]
    code, output, records, restored = results[1]
    output = "".join(early) + output
    restored = restored or next(json.loads(line.split(" ", 1)[1]) for line in early
                                if line.startswith("RESTORED "))
    results[1] = (code, output, records, restored)
    assert all(code == 0 for code, *_ in results), [out[-2000:] for _, out, *_ in results]
    assert [r[3]["step"] for r in results] == [20, 20], results
    kept = sorted(p.name for p in (directory / "damaged").iterdir())
    assert len(kept) == 2 and kept[0].startswith("ckpt-3-") and kept[1].startswith("ckpt-4-")
    assert sorted(os.listdir(directory / "damaged" / kept[1])) == ["ckpt-4.data-00000-of-00001",
                                                                   "ckpt-4.index"]
    assert 'model_checkpoint_path: "ckpt-2"' in state(directory)
    # Said by the chief, which moved them; worker 1 followed the state it rewrote.
    assert [name for name, _ in passed_over(results[0][2])] == ["ckpt-4", "ckpt-3"]
    assert not passed_over(results[1][2]), results[1][1][-2000:]


def test_an_error_that_is_not_the_checkpoints_changes_nothing():
    from launcher.runtime import readable

    assert readable._words(OSError("/x/ckpt-4.data-00000-of-00001; Permission denied"),
                           "/x/ckpt-4") is None
    assert readable._words(IndexError("Read less bytes than requested"), "/x/ckpt-4")


@pytest.mark.parametrize("told", ["elsewhere", "this"])
def test_a_damaged_checkpoint_in_a_directory_the_job_only_reads_is_passed_over_read_only(
        tmp_path, saved, told):
    """A warm start from a directory the job never saved to (the launcher told
    the task other directories: MGPU_SAVE_DIRS, job/policy/savedirs.py; no
    CheckpointManager built for it): the torn newest is passed over all the
    same, but its files and the state file, which others may read, stay as
    they are, and that is said. Told the directory (a save of an earlier
    generation went there), the chief mends it as before."""
    directory = saved(tmp_path, 4)
    tear(directory / f"ckpt-4{DATA}")
    before = state(directory)
    dirs = str(tmp_path / "ours") if told == "elsewhere" else f"/x{os.pathsep}{directory}"
    code, output, records, restored = run(tmp_path, "latest", str(directory),
                                          MGPU_SAVE_DIRS=dirs,
                                          MGPU_CHECKPOINT_DIR=str(tmp_path / "ours"))
    assert code == 0, output[-3000:]
    assert restored["step"] == 30, output[-3000:]
    [(name, why)] = passed_over(records)
    assert name == "ckpt-4", records
    if told == "elsewhere":
        assert why.endswith("not a directory this job saves to: its files and state file "
                            "are left as they are"), why
        assert state(directory) == before and not (directory / "damaged").exists()
        assert (directory / f"ckpt-4{DATA}").exists() and "left as they are" in output
    else:
        assert "ckpt-4" not in state(directory) and (directory / "damaged").is_dir(), output
