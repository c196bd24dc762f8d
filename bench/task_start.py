"""A task's start: `python -m launcher.bootstrap trivial.py` against `python trivial.py`.

A fan-out pays a task's start once per host; pdsh's task is the script alone.
Runs the bootstrap with the environment an agent gives a task of a 32-worker
job (TF_CONFIG, the progress pipe, the stacks, error and profile-request
files, MGPU_TF_HEARTBEAT_S), for this tree and, with `--baseline DIR`, another
checkout, alternately (the order swapped every round), after one discarded
warm-up each (which writes their .pyc files, as a host's code cache has
them), and the bare script in the same rounds. Each tree's `launcher/` is
copied into a folder of its own first, as into a code cache. Per start: the
CPU of the process (`wait4`'s rusage: user + system). Prints the medians.

    .venv/bin/python bench/task_start.py [--baseline DIR] [--runs 21]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = "import sys\nprint('ran on', len(sys.argv))\n"
WORKERS = 32


def _task_env(tree: Path, work: Path, fd: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "MGPU_", "TF_", "KERAS"))}
    cluster = {"worker": [f"10.0.0.{i + 1}:2222" for i in range(WORKERS)]}
    for name in ("stacks", "errors", "profiles"):
        (work / name).mkdir(exist_ok=True)
    env.update({
        "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1",
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 3}}),
        "MGPU_NUM_WORKERS": str(WORKERS), "MGPU_TASK_TYPE": "worker", "MGPU_TASK_INDEX": "3",
        "MGPU_STRATEGY": "multi_worker_mirrored", "MGPU_KERAS": "auto",
        "MGPU_SAVE_FREQ": "epoch", "MGPU_TF_HEARTBEAT_S": "15", "TF_CPP_MIN_LOG_LEVEL": "1",
        "MGPU_CHECKPOINT_DIR": str(work / "ckpt"), "MGPU_RUN_DIR": str(work),
        "MGPU_STACKS_FILE": str(work / "stacks" / "w3.txt"),
        "MGPU_ERROR_FILE": str(work / "errors" / "w3.json"),
        "MGPU_PROFILE_REQUEST": str(work / "profiles" / "w3.request"),
        "MGPU_TASK_TOKEN": "0123456789abcdef", "MGPU_PROGRESS_FD": str(fd),
    })
    return env


def cpu_of(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """CPU seconds (user + system) of one run of argv, output discarded."""
    pid = os.fork()
    if pid == 0:  # the child: output to /dev/null, the progress pipe kept open
        try:
            os.chdir(cwd)  # not the repository: `-m` looks in the working directory first
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed: {status}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, help="another checkout to compare against")
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="task-start-") as tmp:
        root = Path(tmp)
        (root / "trivial.py").write_text(SCRIPT)
        trees = {"this tree": REPO}
        if args.baseline:
            trees = {"baseline": args.baseline.resolve(), **trees}
        copies = {}
        for index, (label, tree) in enumerate(trees.items()):
            copy = root / f"code{index}"
            shutil.copytree(tree / "launcher", copy / "launcher",
                            ignore=shutil.ignore_patterns("__pycache__"))
            copies[label] = copy
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_inheritable(write, True)
        plain_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        argv_of = {label: [sys.executable, "-m", "launcher.bootstrap", str(root / "trivial.py")]
                   for label in copies}
        env_of = {label: _task_env(copy, root, write) for label, copy in copies.items()}
        bare = [sys.executable, str(root / "trivial.py")]
        samples: dict[str, list[float]] = {label: [] for label in [*copies, "python trivial.py"]}
        for round_no in range(args.runs + 1):
            order = list(copies) if round_no % 2 == 0 else list(reversed(copies))
            got = {label: cpu_of(argv_of[label], env_of[label], root) for label in order}
            got["python trivial.py"] = cpu_of(bare, plain_env, root)
            try:
                while os.read(read, 65536):
                    pass
            except BlockingIOError:
                pass
            if round_no:  # the first round writes the .pyc files
                for label, value in got.items():
                    samples[label].append(value)
        for label, values in samples.items():
            print(f"{label:>20}: CPU {statistics.median(values) * 1000:6.1f} ms "
                  f"(median of {len(values)}; quartiles "
                  f"{statistics.quantiles(values, n=4)[0] * 1000:.1f}-"
                  f"{statistics.quantiles(values, n=4)[2] * 1000:.1f})")


if __name__ == "__main__":
    main()
