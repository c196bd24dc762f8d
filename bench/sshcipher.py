"""CPU of a bulk stream over the launcher's SSH connection, by cipher.

The memory tier's peer copies (launcher/agent/peercopy.py) travel agent ->
launcher -> agent over the agents' SSH channels: each byte is encrypted by one
host's sshd, decrypted by paramiko in the launcher, encrypted again by
paramiko and decrypted by the other host's sshd. This streams `--mb` MiB each
way through one simulated host's real sshd (launcher/tools/sshsim.py), with
the cipher the launcher's `Connector` negotiates and with paramiko's own first
choice (aes128-ctr + hmac-sha2-256), alternating, and prints the CPU of the
client (this process: paramiko) and of the host's sshd session process, best
of `--repeat`, and the ratio:

    .venv/bin/python bench/sshcipher.py [--mb 200] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.spec.config import load_config  # noqa: E402
from launcher.spec.plan import host_targets  # noqa: E402
from launcher.tools.sshsim import start_cluster  # noqa: E402
from launcher.transport.ssh_connect import Connector  # noqa: E402

CTR = "aes128-ctr"  # paramiko's first choice, with hmac-sha2-256
# The sshd session process is the shell's parent: its utime + stime, in ticks.
SSHD_CPU = "cut -d' ' -f14,15 /proc/$PPID/stat >&2"


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stream(transport, size: int) -> dict[str, float]:
    """CPU of `size` bytes down (sshd -> client) and up (client -> sshd)."""
    ticks = 100.0  # USER_HZ
    figures = {}
    channel = transport.open_session()
    channel.exec_command(f"head -c {size} /dev/zero; {SSHD_CPU}")
    before, got = own_cpu(), 0
    while data := channel.recv(1 << 20):
        got += len(data)
    figures["down: client"] = own_cpu() - before
    figures["down: sshd"] = sum(map(int, channel.makefile_stderr().read().split())) / ticks
    if got != size:
        sys.exit(f"received {got} bytes of {size}")
    channel = transport.open_session()
    channel.exec_command(f"cat > /dev/null; {SSHD_CPU}")
    chunk = bytes(512 * 1024)
    before = own_cpu()
    for _ in range(size // len(chunk)):
        channel.sendall(chunk)
    channel.shutdown_write()
    sshd = sum(map(int, channel.makefile_stderr().read().split())) / ticks
    figures["up: client"] = own_cpu() - before
    figures["up: sshd"] = sshd
    return figures


def measure(target, cipher: str | None, size: int) -> tuple[str, dict[str, float]]:
    connector = Connector()
    try:
        transport, _ = connector.open(target)
    finally:
        connector.close()
    try:
        if cipher is not None and transport.local_cipher != cipher:
            # Renegotiate with only `cipher` offered: the same connection otherwise.
            options = transport.get_security_options()
            options.ciphers = (cipher,)
            transport.renegotiate_keys()
        used = f"{transport.local_cipher}" + (
            "" if "gcm" in transport.local_cipher else f" + {transport.local_mac}")
        return used, stream(transport, size)
    finally:
        transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = args.mb << 20
    with tempfile.TemporaryDirectory(prefix="sshcipher-") as tmp:
        cluster = start_cluster(1, Path(tmp), sys.executable)
        try:
            target = host_targets(load_config(cluster.yaml_path).config, sys.executable)[0]
            best: dict[str, dict[str, float]] = {}
            names: dict[str, str] = {}
            for _ in range(args.repeat):
                for kind, cipher in (("launcher", None), ("ctr", CTR)):
                    started = time.monotonic()
                    names[kind], figures = measure(target, cipher, size)
                    print(f"{names[kind]:40} {time.monotonic() - started:5.2f} s wall", flush=True)
                    best[kind] = {k: min(v, best.get(kind, {}).get(k, v))
                                  for k, v in figures.items()}
        finally:
            cluster.stop()
    print(f"\n{args.mb} MiB each way, CPU seconds, best of {args.repeat}:")
    print(f"{'':14} {names['launcher']:>24} {names['ctr']:>30} {'ratio':>6}")
    for key in best["launcher"]:
        new, old = best["launcher"][key], best["ctr"][key]
        print(f"{key:14} {new:24.2f} {old:30.2f} {new / old:6.2f}x")
    new, old = sum(best["launcher"].values()), sum(best["ctr"].values())
    print(f"{'all four':14} {new:24.2f} {old:30.2f} {new / old:6.2f}x")


if __name__ == "__main__":
    main()
