"""`mgpu-launch simulate N [--dir DIR] [--python PY] [--detach]` and `simulate stop --dir DIR`.

argv in, N simulated SSH hosts started (launcher/tools/sshsim.py: one private
sshd per loopback address, and a matching cluster YAML), what to try printed;
kept up until Ctrl-C or SIGTERM (or left running with `--detach`), an exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

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
    return parser


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv[1:])
    if args.count == "stop":
        count = stop_directory(Path(args.dir))
        print(f"stopped {count} simulated host(s) in {args.dir}")
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
    try:
        cluster = start_cluster(count, Path(args.dir), args.python,
                                first_address=args.first_address, port=args.port)
    except (RuntimeError, ValueError, OSError) as exc:
        print(f"mgpu-launch simulate: {exc}", file=sys.stderr)
        return exits.USAGE
    first, last = cluster.hosts[0], cluster.hosts[-1]
    print(f"{count} simulated host(s): {first.address} .. {last.address}, sshd port "
          f"{first.port}\ncluster YAML: {cluster.yaml_path}\n"
          f"try:   mgpu-launch check {cluster.yaml_path}\n"
          f"       mgpu-launch {cluster.yaml_path} train.py")
    if args.detach:
        print(f"stop:  mgpu-launch simulate stop --dir {args.dir}")
        return exits.OK
    return _serve(cluster)


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
