"""Wall time of a 2-worker job under mgpu-launch vs. the same job started by hand.

Runs the two side by side, alternating, ROUNDS times each, and prints the
medians and their ratio (target: <= 1.05). "By hand" is what a user would do
without the launcher: two `python train.py` processes, each with its own
TF_CONFIG, and wait for both.

    python bench/overhead.py [--rounds 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from launcher.cli import free_ports  # noqa: E402  (the launcher's own port picker)

SCRIPT = REPO / "examples" / "digits" / "train.py"


def base_env(workdir: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["TF_USE_LEGACY_KERAS"] = "1"
    env["MGPU_CHECKPOINT_DIR"] = os.path.join(workdir, "ckpt-by-hand")
    return env


def by_hand(epochs: int, workdir: str) -> float:
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    start = time.perf_counter()
    procs = []
    for index in range(2):
        env = base_env(workdir)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster,
                                       "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), "--epochs", str(epochs)],
                                      env=env, cwd=workdir, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    if codes != [0, 0]:
        raise SystemExit(f"by-hand run failed: exit codes {codes}")
    return elapsed


def under_launcher(epochs: int, workdir: str, round_no: int) -> float:
    env = base_env(workdir)
    del env["MGPU_CHECKPOINT_DIR"]
    start = time.perf_counter()
    code = subprocess.call(
        [sys.executable, "-m", "launcher", "--local", "2", "--quiet",
         "--run-dir", os.path.join(workdir, f"run{round_no}"), str(SCRIPT),
         "--epochs", str(epochs)],
        env=env, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"launcher run failed: exit code {code}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    hand, launched = [], []
    with tempfile.TemporaryDirectory() as workdir:
        for round_no in range(args.rounds):
            hand.append(by_hand(args.epochs, workdir))
            launched.append(under_launcher(args.epochs, workdir, round_no))
            print(f"round {round_no + 1}: by hand {hand[-1]:6.2f} s   "
                  f"mgpu-launch {launched[-1]:6.2f} s", flush=True)
    h, m = statistics.median(hand), statistics.median(launched)
    print(f"\nmedian wall time, 2 workers, {args.epochs} epochs of digits:")
    print(f"  by hand (TF_CONFIG):   {h:6.2f} s")
    print(f"  mgpu-launch --local 2: {m:6.2f} s")
    print(f"  ratio launcher/by hand: {m / h:.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
