"""The restore after a host's loss: from the copy in another host's memory vs
from a slow shared directory, side by side.

Mounts a throttled FUSE passthrough (tests/slowfs.py, `--mbps`, 20 MB/s by
default: a busy NFS server) and runs TF's custom-loop tutorial
(tests/scripts/tutorial_ctl_big.py, its own CheckpointManager, a save each
epoch) on two local hosts through the real CLI, `restart: {on_host_loss:
wait}`, twice: `checkpoint: {memory: false}`, then `{memory: true}`. Each time
the chief holds after epoch 1's save (HOLD_AT=1) and its whole host goes: the
host0 agent is SIGKILLed (its task dies with it; the next agent there sweeps
its memory folder), the launcher starts a new one and restarts the job.
Prints, per run:

- restore: the restarted chief's managers made and restored (`RESTORE`): from
  the shared directory (off), or from the copy placed in host0's memory from
  host1's, sha256 checked (on);
- placing: the launcher's copy of the save from host1's memory into host0's
  (the `memory_copy` event, placed; on only);
- host lost to first step: the `host_lost` event to the restarted job's first
  step (events.jsonl);

and the ratios off/on. `--width` sizes the weights (about 4 KiB x width:
25000 is ~100 MB). Needs root (FUSE), fuse3 and mfusepy (.ci/run).

    .venv/bin/python bench/peercopy.py [--width 25000] [--mbps 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.slowfs import mounted  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "tutorial_ctl_big.py"


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def kill_host0(launcher: subprocess.Popen) -> None:
    """The host0 agent (and so its task) killed: a simulated host lost."""
    for child in psutil.Process(launcher.pid).children():
        argv = child.cmdline()
        if "launcher.agent" in argv and argv[argv.index("--host") + 1] == "host0":
            child.kill()
            return
    sys.exit("no agent of host0 found")


def run(work: Path, shared: Path, memory: bool, width: int) -> dict[str, float]:
    name = "on" if memory else "off"
    ckpt, run_dir = shared / f"ckpt-{name}", work / f"run-{name}"
    config = work / f"{name}.yaml"
    config.write_text(f"transport: local\ncheckpoint: {{dir: {ckpt}, memory: "
                      f"{str(memory).lower()}}}\nenv: {{HOLD_AT: '1'}}\n"
                      "restart: {backoff_s: 0, on_host_loss: wait, host_wait_s: 120}\n"
                      "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}
    out = work / f"{name}.out"
    with open(out, "w") as sink:
        launcher = subprocess.Popen([sys.executable, "-m", "launcher", "--run-dir", str(run_dir),
                                     str(config), str(SCRIPT), str(ckpt), str(width), "3"],
                                    env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 900
        while "HOLDING" not in out.read_text() or memory and not any(
                e["event"] == "memory_copy" and e.get("checkpoint") == "ckpt-2"
                for e in events(run_dir)):
            if time.monotonic() > deadline or launcher.poll() is not None:
                launcher.kill()
                sys.exit(f"the {name} run never held after epoch 1:\n{out.read_text()[-3000:]}")
            time.sleep(0.2)
        kill_host0(launcher)
        if launcher.wait(timeout=1200) != 0:
            sys.exit(f"the {name} run failed:\n{out.read_text()[-4000:]}")
    chief = [x.split("|", 1)[-1] for x in out.read_text().splitlines()
             if "worker0" in x.split("|", 1)[0]]
    restores = [float(m.group(1)) for m in (re.search(r"RESTORE ([\d.]+)", x) for x in chief)
                if m]
    story = events(run_dir)
    lost = next(e["t"] for e in story if e["event"] == "host_lost")
    first = next(e["t"] for e in story if e["event"] == "progress"
                 and e.get("generation") == 1 and "step" in e)
    placed = [e for e in story if e["event"] == "memory_copy" and e.get("placed")]
    froms = {e["task"]: e.get("resumed_from", "shared") for e in story
             if e["event"] == "progress" and e.get("generation") == 1 and "resumed" in e}
    print(f"memory {name}: restored from {froms}", flush=True)
    return {"restore (s, restarted chief)": restores[-1],
            "placing (s, launcher relay)": placed[0]["seconds"] if placed else 0.0,
            "host lost to first step (s)": first - lost}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=25000)
    parser.add_argument("--mbps", type=float, default=20.0)
    parser.add_argument("--keep", help="a folder to keep the run directories in")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="peercopy-bench-") as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        with mounted(str(work / "backing"), str(work / "shared"), args.mbps) as shared:
            off = run(work, Path(shared), False, args.width)
            on = run(work, Path(shared), True, args.width)
    print(f"weights ~{args.width * 4 * 1026 / 1e6:.0f} MB, shared directory at {args.mbps:g} "
          "MB/s, 2 local hosts, host0 (the chief's) lost after epoch 1's save")
    print(f"{'':30} {'memory off':>11} {'memory on':>11} {'off/on':>8}")
    for key in off:
        ratio = off[key] / on[key] if on[key] else float("inf")
        print(f"{key:30} {off[key]:11.3f} {on[key]:11.3f} {ratio:8.1f}x")


if __name__ == "__main__":
    main()
