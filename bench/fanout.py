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

Each round runs them all in turn, its order turned by one place from the
round before: a run's time depends on the run before it (in a fixed order,
the same launcher tree took 0.13-0.36 s longer in the round's first place than
in its last, four runs of four; docs/benchmarks.md), so with `--repeat` a
multiple of the runs per round (3, one more for each of `--firewall`,
`--baseline`, `--serial` and `--cold-cache`) every run takes every place
equally often.

With `--serial`, each round also connects the bare SSH floor one host at a
time: against the floor's `MAX_PARALLEL` at a time, what the launcher's
parallel handshakes (launcher/transport/ssh.py) gain.

Prints the median of a few runs each and the ratios, plus the CPU time each
client spent (the launcher process vs pdsh and its ssh processes). Simulated
hosts share this machine's cores with the client, so at N=32 the hosts' own
work (sshd, the login shell's rc files, Python starting) dominates the wall
time of both tools; the client CPU column is what still scales on real hosts.
Targets: mgpu-launch <= 1.0x pdsh at N=32, and N=32 within 3x of N=1.

The wall clock of such a CPU-bound fan-out follows the machine's load; the
CPU that everything of one launch spends (the simulated hosts' sshds, their
login shells, agents, tasks, `nft` and its kernel work, the client) is what
load changes least. Run as root where a cgroup file system is mounted, the
bench moves itself (and so the simulated hosts it starts) into a cgroup of
its own and prints that total per launch, for both tools, counted until the
launch's last process (a detached firewall removal) is gone.

It also prints the idle core-seconds of the machine while each tool ran: with
the CPU about equal, the wall-time difference is what one leaves unused. Each
simulated host's login runs `pyenv rehash` (root's ~/.bashrc, below), which
takes a lock shared by all of them: a login that finds it taken sleeps 0.1 s and
tries again. pdsh runs the tasks of the hosts already logged in during those
waits; a launch waits for every host's hello before its first task.

Why the second target is out of reach here: each simulated host's sshd runs
the remote command through root's bash, which sources ~/.bashrc for any
command sshd runs (Debian builds bash with SSH_SOURCE_BASHRC); this machine's
~/.bashrc runs `pyenv init`, ~0.11 s of CPU. 32 of those on 2 shared cores
are ~1.8 s before any Python starts, and the bare-SSH floor line shows the
whole floor. On real hosts that work runs on each host's own cores; what
still grows with N is the client CPU column.

With `--netns` (root), the hosts are network namespaces on one bridge
(launcher/tools/netsim.py, the rig the netns tests use): each host has its own
address, loopback and nftables ruleset, so each host's firewall holds only its
own job's rules, as on real hosts, where on the loopback hosts all N agents'
tables share this machine's one ruleset. The processes still share the 2 cores.

With `--cold-cache`, each round also launches after the agent's bundle was
removed from the hosts' code cache (`~/.cache/mgpu-launch/code/<version>`),
so that launch uploads it over SFTP as the first launch of a version does
(transport/ssh.py, transport/sshbundle.py): the default launch finds it there.
It runs a copy of this tree whose bundle is the bench's own (`ColdTree`), and
prints the cold/warm ratio per size. The simulated hosts share one home, so
one cache: at N > 1 the first host to look uploads and the others find its
copy (one staging folder per cold launch at 8 and at 32 hosts, watched), so
N = 1 is the figure of one host's upload; on real hosts each uploads its own.

With `--baseline DIR` (another checkout, e.g. `git archive` of the commit
before a change), each round also runs that tree's launcher (and agent) on the
same hosts, interleaved: before and after on the same load.

    /work/.venv/bin/python bench/fanout.py [--sizes 1,8,32] [--repeat 3] [--firewall]
                                           [--netns] [--baseline DIR] [--serial]
                                           [--cold-cache]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
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
from launcher.tools import netsim  # noqa: E402
from launcher.tools.sshsim import SimCluster, start_cluster  # noqa: E402
from launcher.transport.shipping import AGENT_MAIN  # noqa: E402
from launcher.transport.ssh import MAX_PARALLEL, REMOTE_CACHE  # noqa: E402
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


class CgroupCPU:
    """The CPU of every process in a cgroup this bench made and moved itself
    into (cgroup v1 `cpuacct`, else v2), from which its children start.
    `open()` is None where that is not possible (not root, no cgroup fs)."""

    def __init__(self, path: Path, counter: str) -> None:
        self.path, self.counter = path, counter
        self.resting = 0  # processes in it between runs: this bench, the sshd listeners

    @classmethod
    def open(cls) -> CgroupCPU | None:
        # A child of the cgroup this process is in (so whatever limits it keeps).
        mine: dict[str, str] = {}
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, controllers, where = line.split(":", 2)
                for controller in controllers.split(",") if controllers else [""]:
                    mine[controller] = where.lstrip("/")
        candidates = []
        if "cpuacct" in mine:
            for mount in ("cpuacct", "cpu,cpuacct"):
                if Path(f"/sys/fs/cgroup/{mount}/cpuacct.usage").exists():
                    candidates.append((Path("/sys/fs/cgroup", mount, mine["cpuacct"]),
                                       "cpuacct.usage"))
                    break
        for mount in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
            if "" in mine and (mount / "cgroup.controllers").exists():
                candidates.append((mount / mine[""], "cpu.stat"))
        for parent, counter in candidates:
            path = parent / f"mgpu-fanout-{os.getpid()}"
            try:
                path.mkdir()
                (path / "cgroup.procs").write_text(f"{os.getpid()}\n")
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            return cls(path, counter)
        return None

    def seconds(self) -> float:
        text = (self.path / self.counter).read_text()
        if self.counter == "cpuacct.usage":
            return int(text) / 1e9
        usage = next(line for line in text.splitlines() if line.startswith("usage_usec"))
        return int(usage.split()[1]) / 1e6

    def processes(self) -> int:
        return len((self.path / "cgroup.procs").read_text().split())

    def settle(self, timeout_s: float = 10.0) -> None:
        """Until only the resting processes are left (a detached firewall removal
        ends a second or so after the launcher)."""
        deadline = time.monotonic() + timeout_s
        while self.processes() > self.resting and time.monotonic() < deadline:
            time.sleep(0.05)

    def spent(self, run):
        """(what `run()` returned, CPU seconds of everything it started)."""
        self.settle()
        before = self.seconds()
        result = run()
        self.settle()
        return result, self.seconds() - before

    def close(self) -> None:
        parent = self.path.parent / "cgroup.procs"
        with contextlib.suppress(OSError):
            parent.write_text(f"{os.getpid()}\n")
            self.settle(5.0)
            self.path.rmdir()


def idle_cores_s() -> float:
    """The machine's idle (and I/O wait) time so far, all cores: in a CPU-bound
    fan-out, what one tool leaves unused that the other fills."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_launcher(yaml_path: Path, script: Path, work: Path,
                 repo: Path = REPO) -> tuple[float, float]:
    """(seconds until the last task exited, seconds for the whole command);
    `repo`: the tree whose launcher runs (and whose agent the hosts get)."""
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    env = dict(os.environ, PYTHONPATH=str(repo))
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


def run_bare_ssh(yaml_path: Path, parallel: int = 64) -> float:
    """Seconds to connect to every host, `parallel` at a time (the launcher's
    MAX_PARALLEL: 64), and run `true` on each."""
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
        with ThreadPoolExecutor(min(parallel, len(hosts))) as pool:
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


class ColdTree:
    """`--cold-cache`: a copy of this tree whose bundle is the bench's alone
    (one comment added to a shipped file: a new bundle id), launched after
    that bundle is removed from the hosts' code cache, so each such launch
    uploads it (transport/ssh.py: the agent's probe exits 98, SFTP, again).
    The simulated hosts share this user's home, so one cache: emptying the
    tree's own bundle could pull it from under another launch of the same
    code on this machine."""

    def __init__(self, work: Path) -> None:
        self.root = work / "cold-tree"
        shutil.copytree(REPO / "launcher", self.root / "launcher",
                        ignore=shutil.ignore_patterns("__pycache__"))
        with open(self.root / "launcher" / "agent" / "__init__.py", "a") as handle:
            handle.write(f"# bench/fanout.py --cold-cache {os.getpid()} {time.time()}\n")
        found = subprocess.run(
            [sys.executable, "-c",
             "from launcher.transport.shipping import bundle_id; print(bundle_id())"],
            cwd=self.root, env=dict(os.environ, PYTHONPATH=str(self.root)),
            capture_output=True, text=True, check=True)
        home = pwd.getpwuid(os.getuid()).pw_dir  # the hosts' SFTP home: where it goes
        self.bundle = Path(home, REMOTE_CACHE, found.stdout.strip())

    def empty(self) -> None:
        shutil.rmtree(self.bundle, ignore_errors=True)

    def launch(self, counted, yaml_path: Path, script: Path, work: Path) -> dict[str, float]:
        self.empty()  # before the count starts
        (ran, total), cpu_all = counted(lambda: run_launcher(yaml_path, script, work, self.root))
        if not (self.bundle / AGENT_MAIN).is_file():
            raise RuntimeError(f"the cold launch left no bundle at {self.bundle}")
        return {"cold": total, "cold_ran": ran, "all_cold": cpu_all}


def measure(cluster: SimCluster, count: int, repeat: int, firewall: bool, work: Path,
            script: Path, meter: CgroupCPU | None,
            baseline: Path | None = None, serial: bool = False,
            cold: ColdTree | None = None) -> dict[str, float]:
    """Medians over `repeat` interleaved rounds at `count` hosts (both tools
    see the same load), each round's order turned by one place: with `repeat`
    a multiple of the runs per round (3, one more for each of `--firewall`,
    `--baseline`, `--serial` and `--cold-cache`), every run is measured in
    every place equally often. `cold/warm`: the median of the rounds' ratios."""
    yaml_path = cluster_yaml(cluster, count, work / f"cluster-{count}.yaml")
    open_path = cluster_yaml(cluster, count, work / f"open-{count}.yaml", "open")
    run_launcher(yaml_path, script, work)  # warm-up: uploads the agent bundle
    if baseline:
        run_launcher(yaml_path, script, work, baseline)  # and the baseline's
    if cold:
        run_launcher(yaml_path, script, work, cold.root)  # its launcher's bytecode
    run_pdsh(cluster, count, script)

    def counted(run):  # (its result, the CPU of all it started; nan without a cgroup)
        return meter.spent(run) if meter else (run(), float("nan"))

    def launch() -> dict[str, float]:
        before, idle_before = children_cpu(), idle_cores_s()
        (ran, total), cpu_all = counted(lambda: run_launcher(yaml_path, script, work))
        return {"ran": ran, "whole": total, "cpu": children_cpu() - before, "all": cpu_all,
                "idle": idle_cores_s() - idle_before}

    def pdsh() -> dict[str, float]:
        before, idle_before = children_cpu(), idle_cores_s()
        took, cpu_all = counted(lambda: run_pdsh(cluster, count, script))
        return {"pdsh": took, "cpu_pdsh": children_cpu() - before, "all_pdsh": cpu_all,
                "idle_pdsh": idle_cores_s() - idle_before}

    def launch_open() -> dict[str, float]:
        (_, total), cpu_all = counted(lambda: run_launcher(open_path, script, work))
        return {"open": total, "all_open": cpu_all}

    def launch_baseline() -> dict[str, float]:
        (_, total), cpu_all = counted(lambda: run_launcher(yaml_path, script, work, baseline))
        return {"base": total, "all_base": cpu_all}

    runs = [launch, pdsh, lambda: {"bare": run_bare_ssh(yaml_path)}]
    runs += [launch_open] if firewall else []
    runs += [launch_baseline] if baseline else []
    runs += [lambda: {"serial": run_bare_ssh(yaml_path, parallel=1)}] if serial else []
    runs += [lambda: cold.launch(counted, yaml_path, script, work)] if cold else []
    samples: dict[str, list[float]] = {}
    for round_no in range(repeat):
        at = round_no % len(runs)  # one place further on each round (the docstring)
        for run in runs[at:] + runs[:at]:
            for key, value in run().items():
                samples.setdefault(key, []).append(value)
    if cold:  # the same round's launches, side by side
        samples["cold/warm"] = [c / w for c, w in zip(samples["cold"], samples["whole"],
                                                      strict=True)]
    return {key: statistics.median(values) for key, values in samples.items()}


def report(rows: dict[int, dict[str, float]], repeat: int, rig: str) -> None:
    load = os.getloadavg()[0]
    print(f"fan-out to N simulated SSH hosts ({rig}), median of {repeat} "
          f"({os.cpu_count()} CPUs, load average {load:.1f} at the end)")
    print(f"{'N':>3}  {'mgpu: all ran':>13}  {'mgpu: command':>13}  {'pdsh':>7}  "
          f"{'ran/pdsh':>8}  {'command/pdsh':>12}  {'client CPU mgpu':>15}  {'pdsh':>6}  "
          f"{'ratio':>6}  {'bare SSH':>8}")
    for count, r in rows.items():
        print(f"{count:>3}  {r['ran']:>12.2f}s  {r['whole']:>12.2f}s  {r['pdsh']:>6.2f}s  "
              f"{r['ran'] / r['pdsh']:>7.2f}x  {r['whole'] / r['pdsh']:>11.2f}x  "
              f"{r['cpu']:>14.2f}s  {r['cpu_pdsh']:>5.2f}s  {r['cpu'] / r['cpu_pdsh']:>5.2f}x  "
              f"{r['bare']:>7.2f}s")
    if len(rows) > 1:
        first, last = rows[min(rows)], rows[max(rows)]
        print(f"mgpu-launch N={max(rows)} vs N={min(rows)}: {last['ran'] / first['ran']:.2f}x "
              f"(all ran), {last['whole'] / first['whole']:.2f}x (command)")
        print(f"pdsh        N={max(rows)} vs N={min(rows)}: {last['pdsh'] / first['pdsh']:.2f}x")
        print(f"bare SSH    N={max(rows)} vs N={min(rows)}: {last['bare'] / first['bare']:.2f}x "
              "(the floor on these simulated hosts)")
    for count, r in rows.items():
        if "open" in r:
            print(f"N={count}: command with tf_ports auto {r['whole']:.2f}s, open "
                  f"{r['open']:.2f}s: the firewall's share {r['whole'] - r['open']:+.2f}s")
    for count, r in rows.items():
        if r["all"] == r["all"]:  # not nan: counted in a cgroup
            opened = (f"; tf_ports open {r['all_open']:.2f}s ({r['all_open'] / r['all_pdsh']:.2f}x)"
                      if "all_open" in r else "")
            based = (f"; baseline tree {r['all_base']:.2f}s ({r['all_base'] / r['all_pdsh']:.2f}x)"
                     if "all_base" in r else "")
            print(f"N={count}: CPU of all processes per launch: mgpu-launch {r['all']:.2f}s, "
                  f"pdsh {r['all_pdsh']:.2f}s: {r['all'] / r['all_pdsh']:.2f}x{opened}{based}")
    for count, r in rows.items():
        print(f"N={count}: idle core-seconds while each ran ({os.cpu_count()} cores): "
              f"mgpu-launch {r['idle']:.2f}s, pdsh {r['idle_pdsh']:.2f}s")
    for count, r in rows.items():
        if "serial" in r:
            print(f"N={count}: bare SSH {MAX_PARALLEL} at a time {r['bare']:.2f}s, one at a time "
                  f"{r['serial']:.2f}s: {r['serial'] / r['bare']:.2f}x")
    for count, r in rows.items():
        if "base" in r:
            print(f"N={count}: command {r['whole']:.2f}s, baseline tree {r['base']:.2f}s")
    report_cold(rows)


def report_cold(rows: dict[int, dict[str, float]]) -> None:
    """`--cold-cache`: the launch that uploads the bundle against the one that finds it."""
    for count, r in rows.items():
        if "cold" not in r:
            continue
        print(f"N={count}: command with the bundle in the hosts' cache {r['whole']:.2f}s, "
              f"uploaded first {r['cold']:.2f}s: {r['cold'] - r['whole']:+.2f}s, "
              f"{r['cold'] / r['whole']:.2f}x (the rounds' ratios: median {r['cold/warm']:.2f}x); "
              f"all ran {r['ran']:.2f}s against {r['cold_ran']:.2f}s")
        if r["all"] == r["all"]:  # not nan: counted in a cgroup
            print(f"N={count}: CPU of all processes per launch, bundle in the cache "
                  f"{r['all']:.2f}s, uploaded first {r['all_cold']:.2f}s: "
                  f"{r['all_cold'] - r['all']:+.2f}s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,8,32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--firewall", action="store_true",
                        help="also run with security.tf_ports: open, interleaved: the "
                        "firewall's share")
    parser.add_argument("--netns", action="store_true",
                        help="hosts as network namespaces on a bridge, each with its own "
                        "ruleset (root)")
    parser.add_argument("--baseline", type=Path,
                        help="another checkout of mgpu-launch (its root folder), run with the "
                        "default settings in each round too: before and after a change")
    parser.add_argument("--serial", action="store_true",
                        help="also connect the bare SSH floor one host at a time: what the "
                        "launcher's parallel handshakes (MAX_PARALLEL) gain")
    parser.add_argument("--cold-cache", action="store_true",
                        help="also launch after the agent's bundle is removed from the hosts' "
                        "code cache (so it is uploaded): what the cache saves per launch")
    args = parser.parse_args()
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: numbers of hosts separated by commas, not {args.sizes!r}")
    if not shutil.which("pdsh"):
        print("pdsh is not installed (apt-get install pdsh)", file=sys.stderr)
        return 2
    if args.netns and (why := "run it as root" if os.geteuid() else netsim.available()):
        print(f"--netns: cannot make network namespaces here: {why}", file=sys.stderr)
        return 2
    meter = CgroupCPU.open()  # before the hosts start: they are counted with it
    switch = netsim.make(max(sizes), outsider=False, label="mgpu-fan") if args.netns else None
    try:
        with tempfile.TemporaryDirectory(prefix="mgpu-fanout-") as tmp:
            work = Path(tmp)
            script = work / "trivial.py"
            script.write_text(TRIVIAL)
            cluster = start_cluster(
                max(sizes), work / "sim", sys.executable,
                addresses=[a for _, a in switch.hosts] if switch else None,
                netns={i: n for i, (n, _) in enumerate(switch.hosts)} if switch else None)
            cold = None
            try:
                cold = ColdTree(work) if args.cold_cache else None
                if meter:
                    meter.resting = meter.processes()
                rows = {count: measure(cluster, count, args.repeat, args.firewall, work,
                                       script, meter, args.baseline, args.serial, cold)
                        for count in sizes}
            finally:
                cluster.stop()
                if cold:
                    cold.empty()  # no bundle of this run's own left behind
    finally:
        if switch:
            netsim.remove(switch)
        if meter:
            meter.close()
    report(rows, args.repeat, "network namespaces" if switch else "loopback addresses")
    return 0


if __name__ == "__main__":
    sys.exit(main())
