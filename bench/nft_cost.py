"""The firewall's per-host cost: one job table installed and removed, step by step.

What one host's agent spends on `security.tf_ports` (launcher/fwrules.py),
measured beside K other job tables in the same ruleset: on a real cluster a
host holds its own table alone (K=0); N simulated hosts on one machine share
one kernel's ruleset (K=N-1). For each step, the median CPU (user + system,
the kernel's work done in the process included) of `--repeat` tries:

- `nft -f` of the rendered rules (the fallback; how the agent installed them
  before launcher/nftlink.py), `nft -f` of a `delete table`, and a bare
  `nft --version` (what starting `nft` costs);
- `nftlink.install` and `nftlink.delete` (netlink from this process), and the
  agent's removal at its exit (`wait=False`: a forked child sends it; parent
  and child counted).

Runs in a network namespace of its own (root, iproute2): the machine's ruleset
is not touched, and nothing else's tables are counted.

    python bench/nft_cost.py [--others 0,31] [--repeat 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher import fwrules, nftlink  # noqa: E402


def seal(i: int) -> fwrules.Seal:
    """A 32-host job's seal (two ports, 32 cluster addresses), as host `i` gets it."""
    return fwrules.seal_for("bench", f"/runs/{i}", f"h{i}", [20000 + i, 21000 + i],
                             [f"10.0.0.{k}" for k in range(1, 33)], "auto")


def children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def nft(script: str) -> None:
    subprocess.run(["nft", "-f", "-"], input=script, text=True, check=True)


def detached_delete(table: str, install) -> float:
    """The agent's removal at its exit (after `install()`, not counted): this
    process's CPU and the child's."""
    install()
    before = time.process_time()
    nftlink.delete(table, wait=False)
    mine = time.process_time() - before
    _, _, usage = os.wait4(-1, 0)
    return mine + usage.ru_utime + usage.ru_stime


def steps(others: int, repeat: int) -> dict[str, float]:
    """Median CPU seconds of each step, with `others` other tables in place."""
    for i in range(1, others + 1):
        nftlink.install(seal(i).table, seal(i).ports, *fwrules.split_families(seal(i).allow),
                        (0,), fwrules.PRIORITY)
    target, uid = seal(0), os.getuid()
    v4, v6 = fwrules.split_families(target.allow)
    script = fwrules.render_nft(target, uid=uid)

    def cpu_of_child(run) -> float:
        before = children()
        run()
        return children() - before

    def cpu_here(run) -> float:
        before = time.process_time()
        run()
        return time.process_time() - before

    taken: dict[str, list[float]] = {}
    for _ in range(repeat):
        for name, cost in (
                ("nft -f install", lambda: cpu_of_child(lambda: nft(script))),
                ("nft -f delete", lambda: cpu_of_child(
                    lambda: nft(f"delete table inet {target.table}\n"))),
                ("nft --version", lambda: cpu_of_child(lambda: subprocess.run(
                    ["nft", "--version"], capture_output=True, check=True))),
                ("nftlink install", lambda: cpu_here(lambda: nftlink.install(
                    target.table, target.ports, v4, v6, (0, uid), fwrules.PRIORITY))),
                ("nftlink delete", lambda: cpu_here(lambda: nftlink.delete(target.table))),
                ("nftlink delete, detached (exit)", lambda: detached_delete(
                    target.table, lambda: nftlink.install(target.table, target.ports, v4, v6,
                                                          (0, uid), fwrules.PRIORITY)))):
            taken.setdefault(name, []).append(cost())
    for i in range(1, others + 1):
        nftlink.delete(seal(i).table)
    return {name: statistics.median(values) for name, values in taken.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--others", default="0,31")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.in_netns:  # again, inside a namespace of its own
        name = f"nftcost-{secrets.token_hex(3)}"
        subprocess.run(["ip", "netns", "add", name], check=True)
        try:
            return subprocess.run(["ip", "netns", "exec", name, sys.executable, __file__,
                                   "--others", args.others, "--repeat", str(args.repeat),
                                   "--in-netns"]).returncode
        finally:
            subprocess.run(["ip", "netns", "del", name], check=False)
    others = [int(k) for k in args.others.split(",")]
    rows = {k: steps(k, args.repeat) for k in others}
    print(f"one host's job table, CPU per step (median of {args.repeat}; "
          f"load average {os.getloadavg()[0]:.1f})")
    print(f"{'step':32s}" + "".join(f"{f'{k} other tables':>18s}" for k in others))
    for name in rows[others[0]]:
        print(f"{name:32s}" + "".join(f"{rows[k][name] * 1000:>15.2f} ms" for k in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
