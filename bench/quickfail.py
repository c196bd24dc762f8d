"""A job that fails at once, with warm standbys and without: standbys must
never cost more than they save.

Runs a script that exits 3 at once on 2 simulated hosts (`transport: local`)
under the real CLI with `restart: {max_restarts: 3, backoff_s: 0}`, i.e. four
generations and three restarts, once with `restart.warm_standby: auto` (the
default) and once with `off`, interleaved, `--rounds` times, and prints the
wall time of each (the mgpu-launch command, start to exit), their medians,
the ratio auto/off side by side, and the starts the standbys gave (warm/cold).

Target: auto/off <= 1.3. (A failed task gets a standby at once, for the
restart that follows; that restart is warm only if the standby has imported
TensorFlow by then, else it starts cold at once and never waits for it.)

    python bench/quickfail.py [--rounds 3] [--restarts 3]
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

CLUSTER = """\
name: quickfail-bench
transport: local
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: host0}}
  - {{address: 127.0.0.1, name: host1}}
restart: {{max_restarts: {restarts}, backoff_s: 0, warm_standby: {standby}}}
"""


def run_once(workdir: Path, standby: str, restarts: int, index: int) -> tuple[float, list[str]]:
    config = workdir / f"cluster-{standby}.yaml"
    config.write_text(CLUSTER.format(standby=standby, restarts=restarts))
    run_dir = workdir / f"run-{standby}-{index}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "launcher", "--quiet", "--run-dir", str(run_dir), str(config),
         str(workdir / "exit3.py")], cwd=workdir, env=env, capture_output=True, text=True,
        timeout=300)
    wall = time.monotonic() - started
    if done.returncode != 1:
        raise SystemExit(f"expected exit 1 (a failed job), got {done.returncode}:\n"
                         f"{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    starts = [e.get("start", "?") for e in events if e["event"] == "task_started"]
    return wall, starts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--restarts", type=int, default=3, help="restart.max_restarts")
    args = parser.parse_args()
    walls: dict[str, list[float]] = {"auto": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="mgpu-quickfail-") as tmp:
        workdir = Path(tmp)
        (workdir / "exit3.py").write_text("import sys\nsys.exit(3)\n")
        print(f"{'round':>5} {'standby':>7} {'wall s':>7}  starts")
        for index in range(args.rounds):
            for standby in ("auto", "off"):
                wall, starts = run_once(workdir, standby, args.restarts, index)
                walls[standby].append(wall)
                warm = starts.count("warm")
                print(f"{index:>5} {standby:>7} {wall:>7.2f}  {len(starts)} starts, {warm} warm",
                      flush=True)
    auto, off = statistics.median(walls["auto"]), statistics.median(walls["off"])
    print(f"median: standbys auto {auto:.2f} s, off {off:.2f} s; auto/off {auto / off:.2f} "
          f"(target <= 1.3); per round: "
          + ", ".join(f"{a / o:.2f}" for a, o in zip(walls["auto"], walls["off"], strict=True)))


if __name__ == "__main__":
    main()
