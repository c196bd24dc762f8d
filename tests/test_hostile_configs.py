"""Cluster files that are wrong, hostile or huge: each is refused by the real
CLI with one line naming the key and its line, exit 2, no traceback, in
bounded time and memory (a YAML alias bomb, a recursive or 3,000-deep file)."""

from __future__ import annotations

import resource
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import PYTHON, cli_env, run_cli

HOST = "transport: local\nhosts:\n  - address: 127.0.0.1\n"
LAUGHS = "".join(
    f"{a}: &{a} [{', '.join([f'*{b}'] * 9) if b else ', '.join(['lol'] * 9)}]\n"
    for a, b in zip("abcdefghij", ["", *"abcdefghi"], strict=True))
DEEP = HOST + "env:\n  X: " + "[" * 3000 + "]" * 3000 + "\n"

CASES = {
    "not UTF-8": (HOST.encode() + b"name: caf\xe9\n",
                  "cluster.yaml:4: name: not UTF-8 text (byte 0xe9"),
    "checkpoint dir is a file": (HOST + "checkpoint:\n  dir: train.py\n",
                                 "cluster.yaml:5: checkpoint.dir: train.py is a file, not a "
                                 "directory"),
    "checkpoint dir below a file": (HOST + "checkpoint:\n  dir: train.py/ckpt\n",
                                    "cluster.yaml:5: checkpoint.dir: train.py/ckpt is below"),
    "checkpoint dir under /proc": (HOST + "checkpoint:\n  dir: /proc/ckpt\n",
                                   "cluster.yaml:5: checkpoint.dir: /proc/ckpt is under /proc"),
    "recursive alias": (HOST + "env: &e\n  X: *e\n",
                        "cluster.yaml:4: env: an alias refers to a value that contains it"),
    "recursive host list": ("transport: local\nhosts: &h\n  - address: 127.0.0.1\n  - *h\n",
                            "cluster.yaml:2: hosts: an alias refers to a value that contains"),
    "3,000 deep": (DEEP, "cluster.yaml:5: env.X: nested more than 50 levels deep"),
    "infinite timeout": (HOST + "restart:\n  hang_timeout_s: .inf\n",
                         "cluster.yaml:5: restart.hang_timeout_s: Input should be a finite "
                         "number"),
    "nan backoff": (HOST + "restart:\n  backoff_s: .nan\n",
                    "cluster.yaml:5: restart.backoff_s: Input should be a finite number"),
    "max_restarts true": (HOST + "restart:\n  max_restarts: true\n",
                          "cluster.yaml:5: restart.max_restarts: Input should be a valid "
                          "integer (got True)"),
    "port true": (HOST + "ssh:\n  port: yes\n",
                  "cluster.yaml:5: ssh.port: Input should be a valid integer (got True)"),
}


def dry_run(folder: Path, content: str | bytes, *args: str,
            **popen: object) -> subprocess.CompletedProcess:
    (folder / "train.py").write_text("print('trained')\n")
    path = folder / "cluster.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return subprocess.run([PYTHON, "-m", "launcher", "--dry-run", *args, "cluster.yaml",
                           "train.py"], cwd=folder, env=cli_env(), capture_output=True,
                          text=True, timeout=120, **popen)


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_cluster_file_names_the_key_and_line_and_exits_2(tmp_path: Path, case: str):
    content, expected = CASES[case]
    done = dry_run(tmp_path, content)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert expected in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not done.stdout


def test_local_with_a_cluster_file_is_refused_before_anything_runs(tmp_path: Path):
    (tmp_path / "cluster.yaml").write_text(HOST)
    (tmp_path / "train.py").write_text("print('trained')\n")
    done = run_cli(["--run-dir", str(tmp_path / "run"), "--local", "2", "cluster.yaml",
                    "train.py"], cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "--local 2 makes the cluster itself, so cluster.yaml would be run" in done.stderr
    assert not (tmp_path / "run").exists()


def limit_memory() -> None:
    # Far above what the launcher needs to read a config, far below what
    # expanding the bomb takes: a run-away walk dies of MemoryError instead.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_yaml_alias_bomb_is_refused_quickly_in_bounded_memory(tmp_path: Path):
    assert len(LAUGHS) < 2048  # ten names, 10^9 values once expanded
    started = time.monotonic()
    done = dry_run(tmp_path, HOST + LAUGHS.replace("j: &j", "env: &j"),
                   preexec_fn=limit_memory)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr[-2000:]
    assert "aliases expand to more than" in done.stderr and "Traceback" not in done.stderr
    # Under a second on a quiet machine: the bound leaves room for a loaded one.
    assert took < 20, took
