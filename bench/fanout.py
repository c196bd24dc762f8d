"""Fan-out: launch until a trivial Python task has run on all of N SSH hosts.

Side by side, on the same simulated hosts (one real sshd per loopback address,
see launcher/tools/sshsim.py), N = 1, 8, 32:

- mgpu-launch: `python -m launcher cluster.yaml trivial.py`. Reported twice:
  until the last task has run (the last `task_exited` in events.jsonl, from
  the moment the command was started) and the whole command (teardown and
  interpreter exit included).
- pdsh: `pdsh -R ssh -f 64 -w HOSTS PYTHON trivial.py` with OpenSSH, the same
  client key and known_hosts.
- bare SSH, the floor: in this process, the launcher's own `Connector` opens
  all N connections in parallel and runs `true` on each: no interpreter start,
  no agent, no task. Its N=32/N=1 ratio is what the simulated hosts alone cost
  as N grows, whatever tool drives them.

With `--firewall`, each round also runs mgpu-launch with `security: {tf_ports:
open}` (no firewall rules), interleaved with the default (`auto`: each host's
agent installs an nftables table before its task and removes it as it exits):
the difference is the firewall's share. Every per-host step added to a launch
gets such a measurement before it lands.

Prints the median of a few runs each and the ratios, plus the CPU time each
client spent (the launcher process vs pdsh and its ssh processes). Simulated
hosts share this machine's cores with the client, so at N=32 the hosts' own
work (sshd, the login shell's rc files, Python starting) dominates the wall
time of both tools; the client CPU column is what still scales on real hosts.
Targets: mgpu-launch <= 1.0x pdsh at N=32, and N=32 within 3x of N=1.

Why the second target is out of reach here: each simulated host's sshd runs
the remote command through root's bash, which sources ~/.bashrc for any
command sshd runs (Debian builds bash with SSH_SOURCE_BASHRC); this machine's
~/.bashrc runs `pyenv init`, ~0.11 s of CPU. 32 of those on 2 shared cores
are ~1.8 s before any Python starts, and the bare-SSH floor line shows the
whole floor. On real hosts that work runs on each host's own cores; what
still grows with N is the client CPU column.

    /work/.venv/bin/python bench/fanout.py [--sizes 1,8,32] [--repeat 3] [--firewall]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.spec.config import load_config  # noqa: E402
from launcher.spec.plan import host_targets  # noqa: E402
from launcher.tools.sshsim import SimCluster, start_cluster  # noqa: E402
from launcher.transport.ssh_connect import Connector  # noqa: E402

TRIVIAL = "import os\nprint('ran on', os.environ.get('MGPU_HOST', os.uname().nodename))\n"


def cluster_yaml(cluster: SimCluster, count: int, path: Path, tf_ports: str = "auto") -> Path:
    config = cluster.config_dict()
    config["hosts"] = config["hosts"][:count]
    config["security"] = {"tf_ports": tf_ports}
    # The tasks do not talk to each other: the default strategy keeps TF out of it.
    config["strategy"] = "multi_worker_mirrored"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_launcher(yaml_path: Path, script: Path, work: Path) -> tuple[float, float]:
    """(seconds until the last task exited, seconds for the whole command)."""
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # As installed: pip compiles the launcher's bytecode once. A shell that sets
    # PYTHONDONTWRITEBYTECODE (this project's machines do) would have every run
    # compile its ~40 modules again, ~0.1 s that no installed launcher pays.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "launcher", "--quiet", "--run-dir",
                           str(run_dir), str(yaml_path), str(script)],
                          cwd=work, env=env, capture_output=True, text=True)
    whole = time.time() - started
    if done.returncode != 0:
        raise RuntimeError(f"mgpu-launch failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    last_exit = max(e["t"] for e in events if e["event"] == "task_exited")
    shutil.rmtree(run_dir, ignore_errors=True)
    return last_exit - started, whole


def run_bare_ssh(yaml_path: Path) -> float:
    """Seconds to connect to every host in parallel and run `true` on each."""
    hosts = host_targets(load_config(yaml_path).config, sys.executable, yaml_path.parent)

    def login(host) -> None:
        transport, _ = connector.open(host)
        try:
            channel = transport.open_session(timeout=30)
            channel.settimeout(30)
            channel.exec_command("true")
            if channel.recv_exit_status() != 0:
                raise RuntimeError(f"`true` failed on {host.name}")
        finally:
            transport.close()

    started = time.time()
    connector = Connector()
    try:
        with ThreadPoolExecutor(min(64, len(hosts))) as pool:
            list(pool.map(login, hosts))
    finally:
        connector.close()
    return time.time() - started


def run_pdsh(cluster: SimCluster, count: int, script: Path) -> float:
    hosts = ",".join(h.address for h in cluster.hosts[:count])
    ssh_args = (f"-p {cluster.hosts[0].port} -i {cluster.client_key} -o BatchMode=yes "
                f"-o UserKnownHostsFile={cluster.known_hosts} -o StrictHostKeyChecking=yes "
                "-o LogLevel=ERROR -l %u %h")
    env = dict(os.environ, PDSH_SSH_ARGS=ssh_args, PDSH_RCMD_TYPE="ssh")
    started = time.time()
    done = subprocess.run(["pdsh", "-R", "ssh", "-f", "64", "-w", hosts, cluster.python,
                           str(script)], env=env, capture_output=True, text=True)
    elapsed = time.time() - started
    ran = sum(1 for line in done.stdout.splitlines() if " ran on " in line)
    if done.returncode != 0 or ran != count:
        raise RuntimeError(f"pdsh failed ({done.returncode}, {ran}/{count} ran):\n"
                           f"{done.stdout}{done.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--firewall", action="store_true",
                        help="also run with security.tf_ports: open, interleaved: the "
                        "firewall's share")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if not shutil.which("pdsh"):
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mgpu-fanout-") as tmp:
        work = Path(tmp)
        script = work / "trivial.py"
        script.write_text(TRIVIAL)
        cluster = start_cluster(max(sizes), work / "sim", sys.executable)
        try:
            rows = []
            opened: list[tuple[int, float, float]] = []
            for count in sizes:
                yaml_path = cluster_yaml(cluster, count, work / f"cluster-{count}.yaml")
                open_path = cluster_yaml(cluster, count, work / f"open-{count}.yaml", "open")
                run_launcher(yaml_path, script, work)  # warm-up: uploads the agent bundle
                run_pdsh(cluster, count, script)
                ours, whole, theirs, cpu_ours, cpu_theirs, bare = [], [], [], [], [], []
                open_whole: list[float] = []
                for _ in range(args.repeat):  # interleaved: both see the same load
                    before = children_cpu()
                    ran, total = run_launcher(yaml_path, script, work)
                    middle = children_cpu()
                    theirs.append(run_pdsh(cluster, count, script))
                    cpu_theirs.append(children_cpu() - middle)
                    cpu_ours.append(middle - before)
                    ours.append(ran)
                    whole.append(total)
                    bare.append(run_bare_ssh(yaml_path))
                    if args.firewall:
                        open_whole.append(run_launcher(open_path, script, work)[1])
                rows.append((count, statistics.median(ours), statistics.median(whole),
                             statistics.median(theirs), statistics.median(cpu_ours),
                             statistics.median(cpu_theirs), statistics.median(bare)))
                if open_whole:
                    opened.append((count, statistics.median(whole),
                                   statistics.median(open_whole)))
        finally:
            cluster.stop()
    load = os.getloadavg()[0]
    print(f"fan-out to N simulated SSH hosts, median of {args.repeat} "
          f"({os.cpu_count()} CPUs, load average {load:.1f} at the end)")
    print(f"{'N':>3}  {'mgpu: all ran':>13}  {'mgpu: command':>13}  {'pdsh':>7}  "
          f"{'ran/pdsh':>8}  {'command/pdsh':>12}  {'client CPU mgpu':>15}  {'pdsh':>6}  "
          f"{'ratio':>6}  {'bare SSH':>8}")
    for count, ran, total, pdsh, cpu, cpu_pdsh, bare in rows:
        print(f"{count:>3}  {ran:>12.2f}s  {total:>12.2f}s  {pdsh:>6.2f}s  {ran / pdsh:>7.2f}x"
              f"  {total / pdsh:>11.2f}x  {cpu:>14.2f}s  {cpu_pdsh:>5.2f}s  "
              f"{cpu / cpu_pdsh:>5.2f}x  {bare:>7.2f}s")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        print(f"mgpu-launch N={last[0]} vs N={first[0]}: {last[1] / first[1]:.2f}x "
              f"(all ran), {last[2] / first[2]:.2f}x (command)")
        print(f"pdsh        N={last[0]} vs N={first[0]}: {last[3] / first[3]:.2f}x")
        print(f"bare SSH    N={last[0]} vs N={first[0]}: {last[6] / first[6]:.2f}x "
              "(the floor on these simulated hosts)")
    for count, sealed, unsealed in opened:
        print(f"N={count}: command with tf_ports auto {sealed:.2f}s, open {unsealed:.2f}s: "
              f"the firewall's share {sealed - unsealed:+.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
