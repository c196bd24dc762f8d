"""Wall time of a 2-worker job under mgpu-launch vs. the same job started by hand.

Runs them side by side, alternating, ROUNDS times each, and prints the
medians and their ratios: by hand, mgpu-launch with warm standbys
(`restart.warm_standby: auto`, the default) and without (`off`). Target:
launcher with standbys / by hand <= 1.0 (a standby costs the job CPU when it
imports TensorFlow beside the training tasks). "By hand" is what a user would
do without the launcher: two `python train.py` processes, each with its own
TF_CONFIG, and wait for both. The launcher runs the same 2 simulated hosts as
`--local 2`, from a cluster file that sets `restart.warm_standby`.

    python bench/overhead.py [--rounds 3] [--epochs 3] [--standby auto,off]
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
from launcher.transport.ports import free_ports  # noqa: E402  (the launcher's own picker)

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


CLUSTER = """\
name: overhead-bench
transport: local
hosts: [{{address: 127.0.0.1, name: host0}}, {{address: 127.0.0.1, name: host1}}]
restart: {{warm_standby: {standby}}}
"""


def under_launcher(epochs: int, workdir: str, round_no: int, standby: str) -> float:
    env = base_env(workdir)
    del env["MGPU_CHECKPOINT_DIR"]
    config = os.path.join(workdir, f"{standby}.yaml")
    with open(config, "w") as handle:
        handle.write(CLUSTER.format(standby=standby))
    start = time.perf_counter()
    code = subprocess.call(
        [sys.executable, "-m", "launcher", "--quiet",
         "--run-dir", os.path.join(workdir, f"run{round_no}-{standby}"), config, str(SCRIPT),
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
    parser.add_argument("--standby", default="auto,off", help="restart.warm_standby settings")
    args = parser.parse_args()
    settings = args.standby.split(",")
    hand: list[float] = []
    launched: dict[str, list[float]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as workdir:
        for round_no in range(args.rounds):
            hand.append(by_hand(args.epochs, workdir))
            line = f"round {round_no + 1}: by hand {hand[-1]:6.2f} s"
            for standby in settings:
                launched[standby].append(under_launcher(args.epochs, workdir, round_no,
                                                        standby))
                line += f"   mgpu-launch (standby {standby}) {launched[standby][-1]:6.2f} s"
            print(line, flush=True)
    h = statistics.median(hand)
    print(f"\nmedian wall time, 2 workers, {args.epochs} epochs of digits:")
    print(f"  by hand (TF_CONFIG):              {h:6.2f} s")
    for standby in settings:
        m = statistics.median(launched[standby])
        target = "  (target <= 1.0)" if standby == "auto" else ""
        print(f"  mgpu-launch, warm_standby {standby:4}:  {m:6.2f} s   ratio to by hand "
              f"{m / h:.3f}{target}")


if __name__ == "__main__":
    main()
