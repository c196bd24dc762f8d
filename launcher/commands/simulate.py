"""`mgpu-launch simulate N [--netns] [--dir DIR] [--python PY] [--detach]` and
`simulate stop --dir DIR`.

argv in, N simulated SSH hosts started (launcher/tools/sshsim.py: one private
sshd per loopback address, and a matching cluster YAML; with `--netns`, each
host in a network namespace of its own on one bridge, launcher/tools/netsim.py:
its own address and firewall ruleset), what to try printed; kept up until
Ctrl-C or SIGTERM (or left running with `--detach`), an exit code. Everything
made is removed at the end (`simulate stop` for a detached cluster).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from ..tools import netsim
from ..tools.sshsim import PRIVSEP_DIR, SimCluster, start_cluster, stop_directory
from . import exits, usage


def _parser() -> usage.Parser:
    parser = usage.Parser(
        prog="mgpu-launch simulate",
        description="Start N simulated SSH hosts (one private sshd per loopback address) "
        "and write a matching cluster YAML.",
        epilog="`mgpu-launch simulate stop --dir DIR` stops a detached cluster.",
    )
    parser.add_argument("count", help="number of hosts, or `stop`")
    parser.add_argument("--dir", default="simulated-cluster",
                        help="where keys, configs, logs and cluster.yaml go")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter the hosts use (default: this one)")
    parser.add_argument("--first-address", default="127.0.0.2")
    parser.add_argument("--port", type=int, help="sshd port (default: 2222 or the next free)")
    parser.add_argument("--detach", action="store_true",
                        help="leave the sshds running in the background and return")
    parser.add_argument("--netns", action="store_true",
                        help="each host in a network namespace of its own (own address, "
                        "firewall ruleset, link), on one bridge: needs root")
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    if args.count == "stop":
        count = stop_directory(Path(args.dir))
        removed = netsim.remove_recorded(Path(args.dir))
        print(f"stopped {count} simulated host(s) in {args.dir}"
              + (f"; removed {', '.join(removed)}" if removed else ""))
        return exits.OK
    try:
        count = int(args.count)
        if not 1 <= count <= 250:
            raise ValueError
    except ValueError:
        parser.error("count must be a number of hosts between 1 and 250, or `stop`")
    if os.geteuid() != 0 and not os.access(PRIVSEP_DIR, os.F_OK):
        print(f"mgpu-launch simulate: {PRIVSEP_DIR} is missing and only root can create it "
              "(OpenSSH needs it)", file=sys.stderr)
        return exits.USAGE
    switch = None
    try:
        if args.netns:
            switch = _switch(count, Path(args.dir))
        cluster = start_cluster(
            count, Path(args.dir), args.python, first_address=args.first_address,
            port=args.port, addresses=[a for _, a in switch.hosts] if switch else None,
            netns={i: n for i, (n, _) in enumerate(switch.hosts)} if switch else None)
    except (RuntimeError, ValueError, OSError) as exc:
        if switch is not None:
            netsim.remove_recorded(Path(args.dir))
        print(f"mgpu-launch simulate: {exc}", file=sys.stderr)
        return exits.USAGE
    _say(cluster, switch, args)
    if args.detach:
        return exits.OK
    return _serve(cluster)


def _switch(count: int, directory: Path) -> netsim.Switch:
    """The hosts' namespaces on one bridge, recorded in `directory` (for `stop`)."""
    if os.geteuid() != 0:
        raise RuntimeError("--netns makes network namespaces: run it as root")
    why = netsim.available()
    if why:
        raise RuntimeError(f"--netns: cannot make network namespaces here: {why}")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    if (directory / netsim.RECORD).exists():
        raise RuntimeError(f"{directory} holds a running --netns cluster: stop it first "
                           f"(mgpu-launch simulate stop --dir {directory})")
    switch = netsim.make(count, outsider=True, label="mgpu-sim")
    try:
        netsim.write_record(directory, switch)
    except OSError:
        netsim.remove(switch)
        raise
    return switch


def _say(cluster: SimCluster, switch: netsim.Switch | None, args) -> None:
    first, last = cluster.hosts[0], cluster.hosts[-1]
    print(f"{len(cluster.hosts)} simulated host(s): {first.address} .. {last.address}, sshd "
          f"port {first.port}\ncluster YAML: {cluster.yaml_path}\n"
          f"try:   mgpu-launch check {cluster.yaml_path}\n"
          f"       mgpu-launch {cluster.yaml_path} train.py")
    if switch is not None:
        host, address = switch.hosts[-1]
        print(f"each host is a network namespace ({switch.hosts[0][0]} ..), this machine is "
              f"{switch.here} on bridge {switch.bridge}; while a job runs, see its seal:\n"
              f"       ip netns exec {switch.hosts[0][0]} nft list ruleset\n"
              f"       ip netns exec {switch.hosts[0][0]} setpriv --reuid=nobody "
              f"--regid=nogroup --clear-groups bash -c 'echo > /dev/tcp/{address}/PORT'"
              "  (refused: another user; PORT: a task's, as --dry-run shows)\n"
              f"       ip netns exec {switch.outsider[0] if switch.outsider else host} "
              f"timeout 3 bash -c 'echo > /dev/tcp/{address}/PORT'"
              "  (no answer: not a host of the job)")
    if args.detach:
        print(f"stop:  mgpu-launch simulate stop --dir {args.dir}")


def _serve(cluster: SimCluster) -> int:
    """Keep the hosts up until Ctrl-C or SIGTERM (0), or until one sshd exits (1)."""
    print("press Ctrl-C to stop them")

    def stop_on_term(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_term)  # `kill` stops the sshds too
    try:
        while all(h.proc is not None and h.proc.poll() is None for h in cluster.hosts):
            time.sleep(0.5)
        print("a simulated sshd exited; stopping the others", file=sys.stderr)
        return exits.FAILED
    except KeyboardInterrupt:
        return exits.OK
    finally:
        cluster.stop()
        stop_directory(cluster.dir)  # and the sessions still open: nothing outlives it
        netsim.remove_recorded(cluster.dir)  # --netns: the namespaces, links and bridge
