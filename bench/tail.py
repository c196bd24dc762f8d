"""The tail of a job: its last training step to the launcher's exit.

Runs the digits example (`examples/digits/train.py`, Keras 3, `runtime`
callbacks) and TensorFlow's multi-worker tutorial as a script brings it
(`tests/scripts/tutorial_mwms.py`: tf.keras, BackupAndRestore, no `runtime`
calls) on 2 simulated hosts (`transport: local`), `--runs` times each, with
each `restart.finished_idle_s` of `--idle` (0: the tail is never cut),
interleaved, and reads each run's events.jsonl, as the launcher saw it:

- `last step`: the last progress report of the last generation;
- `worker0`, `worker1`: each task's exit after that last step (task_exited),
  and when its program was over (program_over: the rest is its teardown);
- `tail`: the last step to `job_done`; `wall`: the mgpu-launch command, start to exit;
- `cut`: whether the launcher ended the job for tasks that sat finished
  (a `tail_cut` event: launcher/job/detect/tailcut.py).

Prints one line per run, then per script the median and the range of the tail.

    python bench/tail.py [--runs 5] [--epochs 4] [--idle 0,5] [--keep DIR]
"""

from __future__ import annotations

import argparse
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
SCRIPTS = {
    "digits": lambda args, work: [str(REPO / "examples/digits/train.py"), "--epochs",
                                  str(args.epochs)],
    "tutorial": lambda args, work: [str(REPO / "tests/scripts/tutorial_mwms.py"), str(work)],
}


CLUSTER = """\
name: tail-bench
transport: local
ports: {{base: auto}}
hosts: [{{address: 127.0.0.1, name: host0}}, {{address: 127.0.0.1, name: host1}}]
restart: {{finished_idle_s: {idle}}}
"""


def run_once(name: str, args: argparse.Namespace, work: Path, index: int, idle: float) -> dict:
    run_dir = work / f"run-{name}-{idle:g}-{index}"
    scratch = work / f"scratch-{name}-{idle:g}-{index}"
    scratch.mkdir()
    (scratch / "cluster.yaml").write_text(CLUSTER.format(idle=idle))
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "launcher", "--quiet", "--run-dir",
                           str(run_dir), "cluster.yaml", *SCRIPTS[name](args, scratch)],
                          cwd=scratch, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}:\n{done.stderr[-2000:]}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    last_gen = max(e.get("generation", 0) for e in events if e["event"] == "launch")
    steps = [e["t"] for e in events if e["event"] == "progress" and e["generation"] == last_gen]
    end = next(e["t"] for e in events if e["event"] == "job_done")
    exits = {e["task"]: e["t"] - steps[-1] for e in events
             if e["event"] == "task_exited" and e["generation"] == last_gen}
    overs = {e["task"]: e["t"] - steps[-1] for e in events
             if e["event"] == "program_over" and e["generation"] == last_gen}
    cut = any(e["event"] == "tail_cut" for e in events)
    if args.keep and (cut or end - steps[-1] > args.keep_over):  # to look into
        shutil.copytree(run_dir, Path(args.keep) / run_dir.name, dirs_exist_ok=True)
    return {"script": name, "idle": idle, "tail": end - steps[-1], "wall": wall,
            "exits": exits, "overs": overs, "cut": cut}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=4, help="of the digits example")
    parser.add_argument("--scripts", default="digits,tutorial")
    parser.add_argument("--idle", default="0,5", help="restart.finished_idle_s values")
    parser.add_argument("--keep", metavar="DIR", help="copy runs cut or with a long tail here")
    parser.add_argument("--keep-over", type=float, default=12.0, metavar="S")
    args = parser.parse_args()
    names = args.scripts.split(",")
    idles = [float(v) for v in args.idle.split(",")]
    results: dict[tuple[str, float], list[dict]] = {(n, i): [] for n in names for i in idles}
    with tempfile.TemporaryDirectory(prefix="mgpu-tail-") as tmp:
        for index in range(args.runs):
            for name in names:
                for idle in idles:
                    result = run_once(name, args, Path(tmp), index, idle)
                    results[name, idle].append(result)
                    exits = ", ".join(
                        f"{task} +{s:.1f} s" + (f" (program over +{result['overs'][task]:.1f})"
                                                if task in result["overs"] else "")
                        for task, s in sorted(result["exits"].items()))
                    print(f"{name:8} idle {idle:g} run {index + 1}: tail {result['tail']:5.1f} s "
                          f"(exits after the last step: {exits}), wall {result['wall']:.1f} s"
                          f"{', cut' if result['cut'] else ''}", flush=True)
    for (name, idle), runs in results.items():
        tails = [r["tail"] for r in runs]
        print(f"{name:8} idle {idle:g}: tail median {statistics.median(tails):.1f} s, "
              f"range {min(tails):.1f}-{max(tails):.1f} s over {len(tails)} runs; "
              f"cut in {sum(r['cut'] for r in runs)}")


if __name__ == "__main__":
    main()
