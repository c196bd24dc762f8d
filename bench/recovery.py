"""How fast a 2-worker job recovers from a crash (kill -9) and a hang (SIGSTOP),
with warm standbys and without.

For each fault and each setting of `restart.warm_standby` (auto, off), runs
the digits example on 2 simulated hosts under the real CLI, waits until both
workers train in their second epoch and the job has trained for `--train-s`
seconds (a real crash comes long after the start; a task's standby is started 5 s
after its first step and needs a few seconds to import TensorFlow), sends
the fault to worker1, waits for the first training step of generation 1 and
stops the job. Then reads the run's `events.jsonl` and prints, side by side:

- kill -> failure_detected, kill -> teardown_done, kill -> first step of
  generation 1 (the first `progress` event of generation 1: a step done);
- the cold start of the same run: launch -> first step of generation 0;
- recovery / cold start, and which start generation 1 got (warm/cold);
- the Ctrl-C (SIGINT to the launcher) that ends each run, to the launcher's
  exit: every task stopped with the full `grace_s`.

With `--repeat N` every row is run N times, interleaved, and the medians are
printed. Targets, standbys on: crash recovery <= 0.5 x cold start; a hang
running again within 15 s of the SIGSTOP. Detection: crash <= 1 s; a task
stopped for good is a hang after 7 s (the launcher's bound,
launcher/job/detect/stalls.py: a shorter freeze is no failure). For scale, Ray
Train's TensorflowTrainer on this machine with the same model: 9.7 s from a
kill and 25.6 s from a hang to the first step after recovery.

    python bench/recovery.py [--faults crash,hang] [--standby auto,off] [--repeat 3]
                             [--backoff 0] [--grace 3] [--train-s 15]

The pause before a restart (`restart.backoff_s`, default 1 s in a cluster file,
doubling after each failure) is policy, not recovery: measured without it by
default; `--backoff 1` adds it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "digits" / "train.py"
TIMEOUT_S = 300.0

CLUSTER = """\
name: recovery-bench
transport: local
ports: {{base: auto}}
hosts:
  - {{address: 127.0.0.1, name: host0}}
  - {{address: 127.0.0.1, name: host1}}
restart: {{backoff_s: {backoff}, grace_s: {grace}, max_restarts: 3, warm_standby: {standby}}}
"""


def read_events(run_dir: Path) -> list[dict]:
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass  # being written
    return out


def wait_until(predicate, what: str):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"bench: timed out waiting for {what}")


def first(events: list[dict], name: str, **match) -> dict | None:
    return next((e for e in events if e["event"] == name
                 and all(e.get(k) == v for k, v in match.items())), None)


def run_fault(fault: str, standby: str, workdir: Path, backoff: float, grace: float,
              train_s: float, tag: str) -> dict[str, float | str]:
    config = workdir / f"{tag}.yaml"
    config.write_text(CLUSTER.format(backoff=backoff, grace=grace, standby=standby))
    run_dir = workdir / f"run-{tag}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    spawned = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "--quiet", "--run-dir", str(run_dir), str(config),
         str(SCRIPT), "--epochs", "1000"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: all(any(e["event"] == "progress" and e.get("task") == t
                                   and e.get("epoch", 0) >= 1 for e in read_events(run_dir))
                               for t in ("worker0", "worker1")), "both workers in epoch 2")
        trained = first(read_events(run_dir), "progress", generation=0)["t"]
        time.sleep(max(0.0, trained + train_s - time.time()))
        victim = first(read_events(run_dir), "task_started", generation=0, task="worker1")
        os.kill(victim["pid"], signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
        fault_t = time.time()
        wait_until(lambda: first(read_events(run_dir), "progress", generation=1),
                   "the first step of generation 1")
    finally:
        interrupted = time.monotonic()
        proc.send_signal(signal.SIGINT)  # a Ctrl-C: every task stopped with the full grace
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stopped = time.monotonic() - interrupted
    events = read_events(run_dir)
    launch = first(events, "launch", generation=0)["t"]
    cold = first(events, "progress", generation=0)["t"] - launch
    recovered = first(events, "progress", generation=1)["t"] - fault_t
    starts = {e.get("start", "cold") for e in events
              if e["event"] == "task_started" and e["generation"] == 1}
    return {
        "detect": first(events, "failure_detected", generation=0)["t"] - fault_t,
        "teardown": first(events, "teardown_done", generation=0)["t"] - fault_t,
        "relaunch": first(events, "launch", generation=1)["t"] - fault_t,
        "recovered": recovered,
        "cold": cold,
        "ratio": recovered / cold,
        # What a user waits for starting the job (or restarting it by hand): from
        # the command to the first step, the launcher's start and connections included.
        "cold_cmd": first(events, "progress", generation=0)["t"] - spawned,
        "ratio_cmd": recovered / (first(events, "progress", generation=0)["t"] - spawned),
        "start": "/".join(sorted(starts)),
        "stop": stopped,  # the Ctrl-C to the launcher's exit
    }


def median_row(runs: list[dict]) -> dict:
    row = {key: statistics.median(r[key] for r in runs) for key in runs[0] if key != "start"}
    row["start"] = "/".join(sorted({r["start"] for r in runs}))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default="crash,hang")
    parser.add_argument("--standby", default="auto,off", help="restart.warm_standby settings")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (medians)")
    parser.add_argument("--backoff", type=float, default=0.0,
                        help="restart.backoff_s (default 0: the recovery itself)")
    parser.add_argument("--grace", type=float, default=3.0, help="restart.grace_s")
    parser.add_argument("--train-s", type=float, default=15.0,
                        help="seconds of training before the fault")
    parser.add_argument("--keep", help="keep the run directories in this folder")
    args = parser.parse_args()
    # A hang is a task stopped past the stall bound (launcher/job/detect/stalls.py, 7 s)
    # seen by heartbeats a second apart; it must be training again within 15 s.
    detect_targets = {"crash": 1.0, "hang": 8.5}
    ratio_targets = {("crash", "auto"): 0.5, ("hang", "auto"): None}
    recovered_targets = {"crash": None, "hang": 15.0}
    rows = [(f, s) for f in args.faults.split(",") for s in args.standby.split(",")]
    runs: dict[tuple[str, str], list[dict]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory(prefix="mgpu-bench-recovery-") as tmp:
        workdir = Path(args.keep).resolve() if args.keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for round_no in range(args.repeat):
            for fault, standby in rows:  # interleaved: a slow minute hits every row alike
                m = run_fault(fault, standby, workdir, args.backoff, args.grace, args.train_s,
                              f"{fault}-{standby}-{round_no}")
                runs[(fault, standby)].append(m)
                print(f"run {round_no + 1}: {fault:5} standby {standby:4}: 1st step "
                      f"{m['recovered']:5.2f} s after the fault, cold start {m['cold']:5.2f} s, "
                      f"ratio {m['ratio']:.2f} ({m['start']}), Ctrl-C to exit "
                      f"{m['stop']:.2f} s", flush=True)
    print(f"\n2 workers, digits example, restart.backoff_s={args.backoff:g}, "
          f"grace_s={args.grace:g}, {args.repeat} run(s) per row (medians); seconds from the "
          "fault (kill -9 / SIGSTOP of worker1)")
    print("cold start: launch event (agents connected) -> first step of generation 0; "
          "from command: the mgpu-launch command -> that step")
    print(f"{'fault':6} {'standby':8} {'start':6} {'detected':>9} {'torn down':>10} "
          f"{'1st step':>9} {'cold start':>11} {'recovery/cold':>14} {'from command':>13} "
          f"{'recovery/cmd':>13} {'Ctrl-C->exit':>13}")
    medians = {row: median_row(runs[row]) for row in rows}
    for (fault, standby), m in medians.items():
        print(f"{fault:6} {standby:8} {m['start']:6} {m['detect']:9.2f} {m['teardown']:10.2f} "
              f"{m['recovered']:9.2f} {m['cold']:11.2f} {m['ratio']:14.2f} "
              f"{m['cold_cmd']:13.2f} {m['ratio_cmd']:13.2f} {m['stop']:13.2f}")
    for (fault, standby), m in medians.items():
        if (fault, standby) not in ratio_targets:
            continue
        target, within = ratio_targets[(fault, standby)], recovered_targets[fault]
        ok = m["detect"] <= detect_targets[fault]
        if target is not None:
            ok = ok and m["ratio"] <= target
            goal = f"recovery {m['ratio']:.2f} x cold start (target <= {target:g})"
        else:
            ok = ok and m["recovered"] <= within
            goal = f"first step {m['recovered']:.2f} s after the fault (target <= {within:g} s)"
        print(f"{fault}, standbys on: detection {m['detect']:.2f} s (target <= "
              f"{detect_targets[fault]:g} s), {goal}: {'met' if ok else 'NOT met'}; "
              f"{m['ratio_cmd']:.2f} x the cold start from the command")


if __name__ == "__main__":
    main()
