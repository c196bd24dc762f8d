"""How long a freeze, and how much CPU oversubscription, a healthy job survives.

A busy or briefly frozen worker is not a dead one: the launcher must not
restart a job for it, yet a worker that stays frozen is a hang, detected and
recovered. This bench runs a 2-worker MultiWorkerMirroredStrategy job
(`tests/scripts/fault_train.py`, ~1 s epochs) under the real CLI with
`--local 2` and prints, per run, whether it restarted:

- freeze S: once both workers train, the victim (`--victim`, default worker0:
  also TensorFlow's coordination leader, the harder case) gets SIGSTOP, then
  SIGCONT after S seconds. Below the launcher's bound (`stalls.STOPPED_HANG_S`)
  the job must train on; above it, it is a hang: the row shows the
  detection time (SIGSTOP -> failure_detected) and when generation 1 started;
- hogs K: K busy processes (`python -c 'while 1: pass'`) run beside the whole
  job on this machine's cores; the job must train to the end without a restart.

    python bench/stalls.py [--freeze 5,6,8,10] [--hogs 4,8,16] [--victim worker0]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recovery import read_events  # bench/ is on sys.path when a bench runs

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "scripts" / "fault_train.py"
TIMEOUT_S = 300.0


def wait_until(predicate, what: str, proc: subprocess.Popen):
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            raise SystemExit(f"the job ended before {what}")
        time.sleep(0.05)
    raise SystemExit(f"timed out waiting for {what}")


def start_job(run_dir: Path, epochs: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.Popen(
        [sys.executable, "-m", "launcher", "--run-dir", str(run_dir), "--local", "2",
         str(SCRIPT), "--epochs", str(epochs)],
        cwd=run_dir.parent, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def outcome(run_dir: Path, proc: subprocess.Popen, since: float | None) -> dict:
    try:
        code: int | str = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the launcher stops its tasks and agents
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        code = "timeout"
    events = read_events(run_dir)
    detected = next((e for e in events if e["event"] == "failure_detected"), None)
    gen1 = [e["t"] for e in events if e["event"] == "task_started" and e["generation"] == 1]
    row = {"exit": code, "restarts": sum(e["event"] == "restart" for e in events),
           "detected": "", "restarted": "", "reason": ""}
    if detected is not None:
        row["reason"] = detected.get("reason", "")[:70]
        if since is not None:
            row["detected"] = f"{detected['t'] - since:.1f}"
            if gen1:
                row["restarted"] = f"{max(gen1) - since:.1f}"
    return row


def run_freeze(seconds: float, victim: str, workdir: Path) -> dict:
    run_dir = workdir / f"freeze-{seconds:g}"
    proc = start_job(run_dir, epochs=6 + int(seconds))

    def training() -> bool:
        events = read_events(run_dir)
        return all(any(e["event"] == "progress" and e.get("task") == t
                       and e.get("epoch", -1) >= 1 for e in events)
                   for t in ("worker0", "worker1"))

    wait_until(training, "both workers training", proc)
    pid = next(e["pid"] for e in read_events(run_dir)
               if e["event"] == "task_started" and e["task"] == victim)
    os.kill(pid, signal.SIGSTOP)
    stopped_at = time.time()
    time.sleep(seconds)  # the fault itself
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # ended as hung
    return outcome(run_dir, proc, stopped_at)


def run_hogs(count: int, workdir: Path) -> dict:
    run_dir = workdir / f"hogs-{count}"
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count)]
    try:
        started = time.monotonic()
        proc = start_job(run_dir, epochs=3)
        row = outcome(run_dir, proc, None)
        row["wall"] = f"{time.monotonic() - started:.1f}"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--freeze", default="5,6,8,10", help="freeze lengths, seconds")
    parser.add_argument("--hogs", default="4,8,16", help="busy processes beside the job")
    parser.add_argument("--victim", default="worker0", choices=("worker0", "worker1"))
    parser.add_argument("--keep", help="keep the run directories in this folder")
    args = parser.parse_args()
    from launcher.job.detect.stalls import STOPPED_HANG_S
    from launcher.spec.taskenv import TF_HEARTBEAT_S

    print(f"{os.cpu_count()} cores; a task stopped > {STOPPED_HANG_S:g} s is a hang; "
          f"TensorFlow coordination heartbeat {TF_HEARTBEAT_S} s")
    print(f"{'fault':<12} {'exit':>4} {'restarts':>8} {'detected':>8} {'restarted':>9} "
          f"{'wall':>6}  first failure")
    with tempfile.TemporaryDirectory(prefix="mgpu-stalls-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for value in filter(None, args.hogs.split(",")):
            row = run_hogs(int(value), workdir)
            print(f"{'hogs ' + value:<12} {row['exit']:>4} {row['restarts']:>8} "
                  f"{row['detected']:>8} {row['restarted']:>9} {row['wall']:>6}  "
                  f"{row['reason']}", flush=True)
        for value in filter(None, args.freeze.split(",")):
            row = run_freeze(float(value), args.victim, workdir)
            print(f"{'freeze ' + value + ' s':<12} {row['exit']:>4} {row['restarts']:>8} "
                  f"{row['detected']:>8} {row['restarted']:>9} {'':>6}  {row['reason']}",
                  flush=True)
    print("(detected, restarted: seconds from SIGSTOP to failure_detected and to the last "
          "task_started of generation 1)")


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    main()
