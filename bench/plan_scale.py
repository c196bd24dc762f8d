"""Time to read and plan a cluster file of 1,000 and 10,000 hosts.

    python bench/plan_scale.py [--hosts 1000 10000] [--rounds 3]

Writes an ssh cluster file of N hosts (two GPUs each, a fixed port base, a
shared checkpoint directory), then times, in this process, the two steps every
launch takes before it reaches a host: `load_config` (YAML, schema and
cross-key checks) and `build_plan` (every task with its TF_CONFIG and
environment), and the TF address of every host (`tf_addresses`, which reads
the ssh config once); then what `--dry-run` prints of that plan, as text and
as `--json` (the cluster's addresses once, each task's own part after them:
the output's size grows with the hosts, not with their square). Prints the
median of ROUNDS rounds of each step and the ratio to the target: a
10,000-host file plans and prints in under 5 s (wall and CPU seconds: on a
loaded machine compare the CPU time). The time grows linearly with the
hosts: 10x the hosts should cost about 10x the time (the `x per host vs
1,000` column); a quadratic step would show about 100x.

Also times the refusal of a 2 KB YAML alias bomb ("billion laughs") and the
memory the process gained meanwhile (its peak RSS before and after).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from launcher.spec.config import ConfigError, load_config  # noqa: E402
from launcher.spec.plan import build_plan, host_targets  # noqa: E402
from launcher.spec.planview import dumps, plan_json, render_plan  # noqa: E402
from launcher.transport.resolve import tf_addresses  # noqa: E402

TARGET_10K_S = 5.0


def cluster_file(folder: Path, hosts: int) -> Path:
    lines = ["name: big", "transport: ssh", "checkpoint:", "  dir: /shared/ckpt/big",
             "ports:", "  base: 30000", "ssh:", "  config_file: null", "hosts:"]
    for i in range(hosts):
        lines += [f"  - address: 10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                  "    gpus: [0, 1]"]
    path = folder / f"hosts{hosts}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def time_steps(path: Path) -> dict[str, float]:
    cpu = time.process_time()
    started = time.perf_counter()
    loaded = load_config(path)
    loaded_at = time.perf_counter()
    addresses = tf_addresses(loaded, host_targets(loaded.config, "python3", loaded.base_dir))
    addressed_at = time.perf_counter()
    plan = build_plan(loaded, ["train.py"], run_dir="/tmp/run", addresses=addresses)
    planned_at = time.perf_counter()
    assert len(plan.tasks) == len(loaded.config.hosts)
    text = render_plan(plan)
    texted_at = time.perf_counter()
    as_json = dumps(plan_json(plan))
    done_at = time.perf_counter()
    return {"load": loaded_at - started, "addresses": addressed_at - loaded_at,
            "plan": planned_at - addressed_at, "text": texted_at - planned_at,
            "json": done_at - texted_at, "total": done_at - started,
            "cpu": time.process_time() - cpu, "mb": (len(text) + len(as_json)) / 1e6}


def alias_bomb(folder: Path) -> tuple[float, float]:
    text = "transport: local\nhosts:\n  - address: 127.0.0.1\n" + "".join(
        f"{a}: &{a} [{', '.join([f'*{b}'] * 9) if b else ', '.join(['lol'] * 9)}]\n"
        for a, b in zip("abcdefghij", ["", *"abcdefghi"], strict=True))
    text = text.replace("j: &j", "env: &j")  # 10^9 values once expanded
    path = folder / "bomb.yaml"
    path.write_text(text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    try:
        load_config(path)
        raise SystemExit("the alias bomb was accepted")
    except ConfigError as exc:
        took = time.perf_counter() - started
        print(f"alias bomb: {exc.problems[0]}")
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return took, grown / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-bomb", action="store_true",
                        help="skip the alias bomb (before the fix it never ends)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mgpu-plan-bench-") as tmp:
        folder = Path(tmp)
        if not args.no_bomb:
            took, grown = alias_bomb(folder)
            print(f"alias bomb ({(folder / 'bomb.yaml').stat().st_size} bytes): refused in "
                  f"{took:.3f} s, peak memory +{grown:.0f} MB")
        print(f"{'hosts':>6} {'load s':>8} {'addr s':>8} {'plan s':>8} {'text s':>8} "
              f"{'json s':>8} {'total s':>8} {'cpu s':>8} {'out MB':>7} "
              f"{'x per host vs first':>20}")
        first: float | None = None
        for hosts in args.hosts:
            path = cluster_file(folder, hosts)
            rounds = [time_steps(path) for _ in range(args.rounds)]
            med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
            per_host = med["total"] / hosts
            first = first or per_host
            print(f"{hosts:>6} {med['load']:>8.2f} {med['addresses']:>8.2f} {med['plan']:>8.2f} "
                  f"{med['text']:>8.2f} {med['json']:>8.2f} {med['total']:>8.2f} "
                  f"{med['cpu']:>8.2f} {med['mb']:>7.1f} {per_host / first:>20.2f}")
            if hosts == 10000:
                print(f"10,000 hosts: {med['total']:.2f} s = {med['total'] / TARGET_10K_S:.2f}x "
                      f"the {TARGET_10K_S:g} s target ({med['cpu']:.2f} s of CPU; on a "
                      f"loaded machine the wall time is the CPU time stretched)")
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
