"""`check`'s peer probes 16 at a time (launcher/commands/check_scripts.py,
PROBE) against one at a time: does the pool pay?

Each host of `mgpu-launch check` runs PROBE, which opens a TCP connection to
every other host's task port, with a timeout (check.py's PEER_TIMEOUT_S, 3 s).
Reachable peers answer in microseconds; a peer behind a firewall that drops
(or a host that is down) costs the whole timeout. This runs the real PROBE
script in a subprocess, as an agent does, against `--peers` peers on
loopback, once with its pool of 16 and once with a pool of 1, alternating:

- `answering`: every peer is a listener that accepts;
- `dropping`: every peer is a listener whose accept queue is full, so the
  kernel drops the SYNs and each connect waits out the timeout (as a
  firewall's drop does).

Prints each run's seconds, then the medians and the ratio one/pool.

    python bench/check_probes.py [--peers 31] [--timeout 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack

from launcher.commands.check_scripts import PROBE

POOL = "min(16, len(peers))"


def answering(stack: ExitStack) -> int:
    server = stack.enter_context(socket.socket())
    server.bind(("127.0.0.1", 0))
    server.listen(4096)
    return server.getsockname()[1]


def dropping(stack: ExitStack) -> int:
    """A listener whose accept queue (of 1) is full: a connect to it times out."""
    server = stack.enter_context(socket.socket())
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    while True:
        client = stack.enter_context(socket.socket())
        client.settimeout(0.5)
        try:
            client.connect(("127.0.0.1", port))
        except TimeoutError:
            return port


def probe(script: str, peers: list[list], timeout: float, folder: str) -> float:
    args = {"peers": peers, "peer_timeout": timeout, "checkpoint_dir": folder,
            "nonce": "x", "nonce_name": "none"}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script, json.dumps(args)],
                          capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"PROBE failed:\n{done.stderr[-2000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=31, help="another host's ports each")
    parser.add_argument("--timeout", type=float, default=1.0, help="check's is 3 s")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    assert POOL in PROBE, "PROBE's pool moved: update this bench"
    scripts = {"pool of 16": PROBE, "one at a time": PROBE.replace(POOL, "1")}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as folder:
        for kind, make in (("answering", answering), ("dropping", dropping)):
            port = make(stack)
            peers = [["127.0.0.1", port]] * args.peers
            took: dict[str, list[float]] = {name: [] for name in scripts}
            for run in range(args.runs):
                for name, script in scripts.items():
                    took[name].append(probe(script, peers, args.timeout, folder))
                    print(f"{kind:9} {name:13} run {run + 1}: {took[name][-1]:.2f} s", flush=True)
            pool, one = (statistics.median(values) for values in took.values())
            print(f"{kind}: {args.peers} peers, timeout {args.timeout:g} s: pool of 16 "
                  f"{pool:.2f} s, one at a time {one:.2f} s: {one / pool:.2f}x", flush=True)


if __name__ == "__main__":
    main()
