"""The agent's start: from spawn to its hello line, for two code trees side by side.

Starts `python -S -m launcher.agent` the way the local transport does
(launcher/transport/child.py: `-S`, the tree on PYTHONPATH, stdin and stdout
pipes), or with `--ssh` the SSH transport's remote command (each tree's own
`agent_command`: `python -S -c`, the code cache checked, run by `sh`), in the
tree's folder (`-m` looks in the working directory first), reads its stdout
until the hello and measures, per start:

- wall: from just before the spawn to the hello line read;
- CPU: what the agent process used up to the hello (every thread's
  /proc/PID/task/*/schedstat run time, read as soon as the hello arrives);
- RSS: the agent's peak resident memory (VmHWM) at the hello.

Each tree's `launcher/` package is first copied into one temporary folder
(as a bundle is installed into the code cache), so both load from the same
file system with nothing else beside them on the path. Then it closes the
agent's stdin and waits for its exit. The two trees run
alternately (the order swapped every round), each with a fresh run directory,
after one discarded warm-up start each (which also writes their .pyc files).
Prints the medians and the ratio new/baseline; a fan-out to N hosts pays the
CPU column once per host. Target: the new tree not worse (within noise).

    git -C /work/main worktree add --detach /tmp/agentsplit-base <commit>
    .venv/bin/python bench/agent_start.py --baseline /tmp/agentsplit-base [--runs 20] [--ssh]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 30.0


def _cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of `pid` (schedstat: nanoseconds on a CPU)."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as handle:
                total += int(handle.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def _peak_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return float("nan")


def ssh_command(tree: Path, run_dir: Path) -> list[str]:
    """The SSH transport's remote command for the agent in `tree` (that tree's
    own `agent_command`: `python -S -c` with the code cache's check), run by sh."""
    code = ("import sys; from launcher.transport.sshbundle import agent_command; "
            "print(agent_command(sys.argv[1], sys.argv[2], 'bench', sys.argv[3], 0, 0, "
            "home=sys.argv[4]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    command = subprocess.run(
        [sys.executable, "-c", code, sys.executable, tree.name, str(run_dir), str(tree.parent)],
        env=dict(env, PYTHONPATH=str(tree)), cwd=tree, capture_output=True, text=True,
        check=True).stdout.strip()
    return ["/bin/sh", "-c", command]


def start_once(tree: Path, run_dir: Path, ssh: bool = False) -> dict[str, float]:
    """One agent start from `tree`: wall and CPU seconds to its hello, peak RSS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(tree)
    argv = [sys.executable, "-S", "-m", "launcher.agent", "--host", "bench",
            "--run-dir", str(run_dir), "--eof-grace", "0", "--lease", "0"]
    if ssh:
        argv = ssh_command(tree, run_dir)
        del env["PYTHONPATH"]  # the command sets it
    began = time.perf_counter()
    # cwd: the tree (as PYTHONPATH), not this repository, which `-m` would look in first.
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=tree)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"agent from {tree} ended before its hello: "
                                   f"{proc.stderr.read().decode(errors='replace')[-500:]}")
            if json.loads(line).get("ev") == "hello":
                break
        wall = time.perf_counter() - began
        cpu, rss = _cpu_s(proc.pid), _peak_rss_mb(proc.pid)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return {"wall": wall, "cpu": cpu, "rss": rss}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, type=Path,
                        help="a checkout of the code to compare against (its repo root)")
    parser.add_argument("--new", type=Path, default=REPO, help="the code measured (this tree)")
    parser.add_argument("--runs", type=int, default=20, help="starts per tree")
    parser.add_argument("--ssh", action="store_true",
                        help="start it with the SSH transport's remote command (`python -S "
                             "-c`, the code cache checked) instead of `python -S -m`")
    args = parser.parse_args()
    trees = {"baseline": args.baseline.resolve(), "new": args.new.resolve()}
    for name, tree in trees.items():
        if not (tree / "launcher" / "__init__.py").exists():
            parser.error(f"--{name} {tree}: no launcher package there")
    work = Path(tempfile.mkdtemp(prefix="agent-start-bench-"))
    copies = {}
    for name, tree in trees.items():  # same file system, nothing else on the path
        copies[name] = work / f"code-{name}"
        shutil.copytree(tree / "launcher", copies[name] / "launcher",
                        ignore=shutil.ignore_patterns("__pycache__"))
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        for name in trees:  # warm-up: .pyc files, page cache
            start_once(copies[name], work / f"warm-{name}", args.ssh)
        for index in range(args.runs):
            order = list(trees) if index % 2 == 0 else list(reversed(trees))
            for name in order:
                samples[name].append(start_once(copies[name], work / f"{name}-{index}",
                                                args.ssh))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"agent start, {args.runs} runs each, alternating ({sys.executable}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print(f"  baseline: {trees['baseline']}\n  new:      {trees['new']}")
    print(f"{'':22}{'baseline':>10}{'new':>10}{'new/old':>9}")
    for key, label, scale in (("wall", "to hello, wall (ms)", 1e3),
                              ("cpu", "to hello, CPU (ms)", 1e3),
                              ("rss", "peak RSS (MiB)", 1.0)):
        old = statistics.median(s[key] for s in samples["baseline"]) * scale
        new = statistics.median(s[key] for s in samples["new"]) * scale
        print(f"{label:22}{old:10.1f}{new:10.1f}{new / old:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
