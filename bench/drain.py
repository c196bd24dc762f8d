"""The supervisor's messages handled in batches (`MAX_BATCH` per loop turn,
launcher/job/run/runner.py) against one per turn: does the batch pay?

Runs a job of 2 simulated hosts (`transport: local`) whose tasks each print
`--lines` lines as fast as they can (no TensorFlow), once with the launcher's
MAX_BATCH and once with 1, alternating, `--runs` times. Per run: the lines that
reached the logs (the rest were dropped at the inbox's bound, said), the
launcher's own CPU seconds (its process alone, read until it exits), lines per
CPU second, how long after a task's last line the launcher saw its exit (the
slower task's), and the wall time. Prints each run, then the medians and the
ratio batch/one of lines per CPU second.

    python bench/drain.py [--runs 4] [--lines 200000]
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

import psutil

REPO = Path(__file__).resolve().parent.parent
FLOOD = """\
import os, sys
n = int(os.environ["FLOOD_LINES"])
for i in range(n):
    sys.stdout.write(f"flood line {i} of {n}: some words to make it a log line\\n")
sys.stdout.flush()
with open(f"end-{os.getpid()}", "w") as end:  # when its last line was written
    end.write(repr(__import__("time").time()))
"""
CLUSTER = """\
name: drain-bench
transport: local
ports: {base: auto}
hosts: [{address: 127.0.0.1, name: host0}, {address: 127.0.0.1, name: host1}]
"""
LAUNCH = """\
import sys
import launcher.job.run.runner as runner
if {batch}:
    runner.MAX_BATCH = {batch}
from launcher.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_once(work: Path, name: str, batch: int, lines: int) -> dict:
    run_dir = work / name
    env = dict(os.environ, PYTHONPATH=str(REPO), FLOOD_LINES=str(lines))
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH.format(batch=batch), "--quiet",
                             "--run-dir", str(run_dir), "cluster.yaml", "flood.py"],
                            cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    watched, cpu = psutil.Process(proc.pid), 0.0
    while proc.poll() is None:
        try:
            times = watched.cpu_times()
            cpu = times.user + times.system
        except psutil.Error:
            pass
        time.sleep(0.05)
    output = proc.stdout.read()
    wall = time.monotonic() - started
    if proc.returncode != 0:
        raise SystemExit(f"exit {proc.returncode}:\n{output[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    pids = {e["task"]: e["pid"] for e in events if e["event"] == "task_started"}
    seen = max(e["t"] - float((work / f"end-{pids[e['task']]}").read_text())
               for e in events if e["event"] == "task_exited")
    logged = sum(sum(1 for line in path.read_text().splitlines() if line.startswith("flood"))
                 for path in (run_dir / "logs").glob("*.log"))
    return {"logged": logged, "cpu": cpu, "wall": wall, "rate": logged / max(cpu, 1e-9),
            "exit_seen": seen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--lines", type=int, default=200_000, help="per task")
    args = parser.parse_args()
    from launcher.job.run.runner import MAX_BATCH
    sides = {f"batch {MAX_BATCH}": 0, "one per turn": 1}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory(prefix="mgpu-drain-") as tmp:
        work = Path(tmp)
        (work / "flood.py").write_text(FLOOD)
        (work / "cluster.yaml").write_text(CLUSTER)
        for index in range(args.runs):
            for side, batch in sides.items():
                result = run_once(work, f"run-{batch}-{index}", batch, args.lines)
                results[side].append(result)
                print(f"{side:13} run {index + 1}: {result['logged']:7d} lines logged, "
                      f"launcher CPU {result['cpu']:.2f} s, {result['rate']:.0f} lines/CPU s, "
                      f"exit seen {result['exit_seen']:.2f} s after the last line, "
                      f"wall {result['wall']:.1f} s", flush=True)
    medians = {side: statistics.median(r["rate"] for r in runs) for side, runs in results.items()}
    for side, runs in results.items():
        print(f"{side:13}: median {medians[side]:.0f} lines/CPU s, exit seen "
              f"{statistics.median(r['exit_seen'] for r in runs):.2f} s after the last line, "
              f"wall {statistics.median(r['wall'] for r in runs):.1f} s")
    first, second = medians.values()
    print(f"lines per launcher CPU second, batch / one per turn: {first / second:.3f}")


if __name__ == "__main__":
    main()
