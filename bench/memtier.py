"""The memory tier against a slow shared directory, off and on, side by side.

Mounts a throttled FUSE passthrough (tests/slowfs.py: reads and writes share
`--mbps`, 20 MB/s by default: a busy NFS server) and runs TF's custom-loop
tutorial (tests/scripts/tutorial_ctl_big.py: MultiWorkerMirroredStrategy, its
own CheckpointManager, a save each epoch) on two local workers through the
real CLI, twice: `checkpoint: {memory: false}` then `{memory: true}`, each
with worker 1 killed (SIGKILL) after the save of epoch 1. Prints, per run:

- step time: the chief's training steps between saves (median, past the first
  epoch's compile), the tier's cost on the steps themselves;
- save stall: how long the chief's `manager.save()` blocked its loop (median);
- checkpointing: the goodput ledger's part (summary.json), all saves;
- restore: the restarted chief's managers made and restored (`RESTORE`);
- crash to first step: the killed task's exit to the restarted job's first
  step (events.jsonl), and its parts, each ended by the last task's event of
  it: the failure detected, the teardown, the tasks started (with the memory
  tier, once their host's copies to the directory are done), the cluster
  joined, the resume told (the model built and restored), the first step;

and the ratios off/on. `--width` sizes the weights (about 4 KiB x width:
25000 is ~100 MB). Needs root (FUSE), fuse3 and mfusepy (.ci/run).

    .venv/bin/python bench/memtier.py [--width 25000] [--mbps 20] [--epochs 3]

`--cost`: the tier's cost on the training steps themselves, beside CPU-bound
workers (two on this machine's cores). No kill; each run saves every third
epoch of 10 steps (SAVE_EVERY=3: epochs 0, 3, 6, 9), so the epoch after a
save runs beside its copies and the one before the next save is quiet (the
epoch after the first save is left out: it is slower with the tier off too,
TensorFlow's own, when the save is fast): their step
times, paired within a run, cancel the load other work puts on the machine
meanwhile (beside / quiet: ~1 with the tier off). Runs alternate: off, then
`--rounds` times on, on without the second copy in another host's memory
(`env: {MGPU_MEMORY_PEER: 0}`), off (the two on runs swapped in every other
round). Prints each run's figures and the copies' lag behind the save, then
beside / quiet per kind, and on / off of the epochs beside copies against how
far the two off runs lie apart, and the load average after each run.
`--runs 'off;on'` leaves out the other kinds (a run is ~80 s). About 5
minutes with one round:

    uptime; .venv/bin/python bench/memtier.py --cost [--rounds 1] [--epochs 10] [--runs ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.slowfs import mounted  # noqa: E402

SCRIPT = REPO / "tests" / "scripts" / "tutorial_ctl_big.py"


def run(work: Path, shared: Path, memory: bool, width: int, epochs: int) -> dict[str, float]:
    name = "on" if memory else "off"
    ckpt, run_dir = shared / f"ckpt-{name}", work / f"run-{name}"
    config = work / f"{name}.yaml"
    config.write_text(f"transport: local\ncheckpoint: {{dir: {ckpt}, memory: "
                      f"{str(memory).lower()}}}\nrestart: {{backoff_s: 0}}\n"
                      "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2", "KILL_AT": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher", "--run-dir", str(run_dir),
                           str(config), str(SCRIPT), str(ckpt), str(width), str(epochs)],
                          env=env, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        sys.exit(f"the {name} run failed:\n{done.stdout[-4000:]}")
    chief = [line.split("|", 1)[-1] for line in done.stdout.splitlines()
             if "worker0" in line.split("|", 1)[0]]
    saves = [float(m.group(1)) for m in (re.search(r"SAVE \d+ ([\d.]+)", x) for x in chief)
             if m]
    steps = [float(m.group(1)) for m in (re.search(r"STEPS [1-9]\d* ([\d.]+)", x)
                                         for x in chief) if m]  # the first epoch compiles
    restores = [float(m.group(1)) for m in (re.search(r"RESTORE ([\d.]+)", x) for x in chief)
                if m]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"step time (ms, median)": 1000 * statistics.median(steps),
            "save stall (s, median)": statistics.median(saves),
            "checkpointing (s, goodput)": summary["goodput"]["parts"]["checkpointing"],
            "restore (s, restarted chief)": restores[-1],
            **crash_to_step(run_dir)}


def crash_to_step(run_dir: Path) -> dict[str, float]:
    """The kill to the restarted job's first step, and where that time went,
    from events.jsonl: each part ends at the last task's event of it."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]

    def last(kind: str, gen: int, **match) -> float:
        return max(e["t"] for e in events if e["event"] == kind and e.get("generation") == gen
                   and all(e.get(k) == v for k, v in match.items()))

    marks = [("killed", min(e["t"] for e in events if e["event"] == "task_exited"
                            and e.get("generation") == 0 and e.get("signal") == 9)),
             ("  detected", last("failure_detected", 0)),
             ("  torn down", last("teardown_done", 0)),
             ("  tasks started (copies drained)", last("task_started", 1)),
             ("  cluster joined (script, MWMS)", last("cluster", 1, state="joined")),
             ("  resumed (model built, restored)", min(e["t"] for e in events
                                                      if e["event"] == "resumed")),
             ("  first step", min(e["t"] for e in events if e["event"] == "progress"
                                  and e.get("generation") == 1 and "step" in e))]
    out = {"crash to first step (s)": marks[-1][1] - marks[0][1]}
    for (_, before), (name, at) in zip(marks, marks[1:], strict=False):
        out[f"{name} (s)"] = at - before
    return out


COST_RUNS = {"off": "memory: false", "on": "memory: true",
             "on, no peer copy": "memory: true}\nenv: {MGPU_MEMORY_PEER: 0"}
EVERY = 3  # a save every 3 epochs: the epoch after it overlaps its copies, the third not


def cost_run(work: Path, shared: Path, name: str, width: int, epochs: int) -> dict:
    """One run of --cost: the chief's step time in the epochs just after a save
    (beside its copies) and in those before the next (quiet); the copies' lag."""
    tag = f"{name.replace(' ', '').replace(',', '-')}-{len(list(work.glob('run-*')))}"
    ckpt, run_dir, config = shared / f"ckpt-{tag}", work / f"run-{tag}", work / f"{tag}.yaml"
    config.write_text(f"transport: local\ncheckpoint: {{dir: {ckpt}, {COST_RUNS[name]}}}\n"
                      "hosts:\n  - {address: 127.0.0.1}\n  - {address: 127.0.0.1}\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
           "SAVE_EVERY": str(EVERY)}
    done = subprocess.run([sys.executable, "-m", "launcher", "--run-dir", str(run_dir),
                           str(config), str(SCRIPT), str(ckpt), str(width), str(epochs)],
                          env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"the {name} run failed:\n{done.stdout[-4000:]}")
    steps = {int(m.group(1)): float(m.group(2)) for m in (
        re.search(r"STEPS (\d+) ([\d.]+)", line.split("|", 1)[-1])
        for line in done.stdout.splitlines() if "worker0" in line.split("|", 1)[0]) if m}
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    lags = [e.get("memory_copy_lag_s", e.get("memory_copy_s")) for e in events
            if e["event"] == "progress" and "memory_copy_s" in e]
    peer = [e["seconds"] for e in events if e["event"] == "memory_copy" and not e.get("error")]
    covered = [e for e in events if e["event"] == "memory_copy" and e.get("covered_by")]
    # Not the epoch after the first save: TensorFlow's own (with the tier off and a
    # fast directory it runs ~1.7x slower too); epoch 0 compiles.
    beside = [s for e, s in steps.items() if e % EVERY == 1 and e > 1]
    quiet = [s for e, s in steps.items() if e % EVERY == 0 and e > 0]
    return {"name": name, "beside": statistics.mean(beside), "quiet": statistics.mean(quiet),
            "epochs": [steps[e] for e in sorted(steps)][1:],
            "lag": max(lags, default=0.0), "peer": max(peer, default=0.0),
            "covered": f"{len(covered)} of {len(peer)}"}


def cost(work: Path, shared: Path, args: argparse.Namespace) -> None:
    """--cost: off, on, on without the peer copy, alternating (module docstring)."""
    order, runs = args.runs.split(";"), []
    if order[0] != "off" or any(n not in COST_RUNS for n in order):
        sys.exit(f"--runs: 'off' first, then any of {list(COST_RUNS)}, separated by ';'")
    sequence = ["off"] + [n for rnd in range(args.rounds)
                          for n in (order[1:] if rnd % 2 == 0 else order[:0:-1]) + ["off"]]
    for name in sequence:
        runs.append(cost_run(work, shared, name, args.width, args.epochs))
        r = runs[-1]
        print(f"{r['name']:17} beside copies {1000 * r['beside']:5.0f} ms, quiet "
              f"{1000 * r['quiet']:5.0f} ms: {r['beside'] / r['quiet']:.3f} (epochs 1..: "
              f"{' '.join(f'{1000 * s:.0f}' for s in r['epochs'])}); copy lag: directory "
              f"<= {r['lag']:.1f} s, peer <= {r['peer']:.1f} s ({r['covered']} covered by a "
              f"worker's own save); load {os.getloadavg()[0]:.1f}",
              flush=True)
    print(f"weights ~{args.width * 4 * 1026 / 1e6:.0f} MB, shared directory at {args.mbps:g} "
          f"MB/s, 2 workers, a save every {EVERY} epochs of 10 steps, {len(runs)} runs")
    paired = {n: [r["beside"] / r["quiet"] for r in runs if r["name"] == n] for n in order}
    for name in order:
        print(f"{name:17} step time beside copies / quiet: "
              f"{statistics.mean(paired[name]):.3f} ({' '.join(f'{x:.3f}' for x in paired[name])})")
    beside = {n: statistics.mean(r["beside"] for r in runs if r["name"] == n) for n in order}
    offs = [r["beside"] for r in runs if r["name"] == "off"]
    print("beside copies, / off: " + ", ".join(f"{n} {beside[n] / beside['off']:.3f}"
                                                for n in order[1:])
          + f"; off runs apart by {100 * (max(offs) - min(offs)) / beside['off']:.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=25000)
    parser.add_argument("--mbps", type=float, default=20.0)
    parser.add_argument("--epochs", type=int, default=None, help="3; with --cost 10")
    parser.add_argument("--cost", action="store_true", help="step time only, alternating")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--runs", default=";".join(COST_RUNS),
                        help="with --cost: the kinds of run, 'off' first, separated by ';' "
                        "(default: %(default)s)")
    parser.add_argument("--keep", help="a folder to keep the run directories in")
    args = parser.parse_args()
    args.epochs = args.epochs or (10 if args.cost else 3)
    if args.cost:
        with tempfile.TemporaryDirectory(prefix="memtier-bench-") as tmp:
            work = Path(args.keep or tmp)
            with mounted(str(work / "backing"), str(work / "shared"), args.mbps) as shared:
                cost(work, Path(shared), args)
        return
    with tempfile.TemporaryDirectory(prefix="memtier-bench-") as tmp:
        work = Path(args.keep or tmp)
        with mounted(str(work / "backing"), str(work / "shared"), args.mbps) as shared:
            off = run(work, Path(shared), False, args.width, args.epochs)
            on = run(work, Path(shared), True, args.width, args.epochs)
    print(f"weights ~{args.width * 4 * 1026 / 1e6:.0f} MB, shared directory at {args.mbps:g} "
          f"MB/s, 2 workers, worker 1 killed after epoch 1's save")
    print(f"{'':36} {'memory off':>11} {'memory on':>11} {'off/on':>8}")
    for key in off:
        ratio = f"{off[key] / on[key]:7.1f}x" if on[key] > 0.05 else ""  # not of a part ~0
        print(f"{key:36} {off[key]:11.3f} {on[key]:11.3f} {ratio:>8}")


if __name__ == "__main__":
    main()
