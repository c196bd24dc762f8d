"""`ports.base: auto`'s ports (launcher/transport/ports.py): free, distinct, and
outside the kernel's ephemeral range, where an outgoing connection could take
one before TensorFlow binds it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from launcher.job.run.launch import Launch
from launcher.spec import slurm
from launcher.spec.config import local_config
from launcher.transport.ports import (
    AUTO_PORTS,
    RESERVED_FOR_S,
    busy_ports,
    ephemeral_range,
    free_ports,
)

ROOT = Path(__file__).resolve().parents[1]


def _outside_ephemeral(ports: list[int]) -> bool:
    first, last = ephemeral_range()
    return not any(first <= p <= last for p in ports)


def test_auto_ports_are_distinct_free_and_outside_the_ephemeral_range():
    for _ in range(20):
        ports = free_ports(8)
        assert len(set(ports)) == 8
        assert _outside_ephemeral(ports), ports
        assert busy_ports(ports) == []


def test_a_port_held_by_a_listener_is_never_picked():
    window = next(range(p, p + 6) for p in AUTO_PORTS[::6] if not busy_ports(range(p, p + 6)))
    holders = []
    try:
        for port in window[:4]:
            holder = socket.socket()
            holder.bind(("", port))
            holder.listen()
            holders.append(holder)
        for _ in range(10):
            assert sorted(free_ports(2, among=window)) == list(window[4:])
        # All of them held: the kernel's picks, still free and distinct.
        fallback = free_ports(2, among=window[:4])
        assert len(set(fallback)) == 2 and busy_ports(fallback) == []
    finally:
        for holder in holders:
            holder.close()


def test_the_ephemeral_range_is_read_or_linux_default(tmp_path: Path):
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    (tmp_path / "garbage").write_text("not a range\n")
    assert ephemeral_range(str(tmp_path / "garbage")) == (32768, 60999)
    (tmp_path / "range").write_text("49152\t65535\n")  # as the kernel writes it
    assert ephemeral_range(str(tmp_path / "range")) == (49152, 65535)


def test_a_local_plan_takes_auto_ports_outside_the_ephemeral_range(tmp_path: Path):
    loaded = replace(local_config(4), base_dir=tmp_path)  # simulated hosts: ports auto
    launch = Launch(loaded, ["train.py"], tmp_path / "run")
    for generation in range(3):  # every generation picks afresh
        plan = launch.plan(generation)
        ports = [t.port for t in plan.tasks if t.port]
        assert len(set(ports)) == 4 and _outside_ephemeral(ports), ports
        launch.check_ports(plan)  # free: not refused


def test_a_slurm_jobs_auto_ports_stay_below_linuxs_default_ephemeral_range():
    """Under Slurm the base comes from the job id (the nodes cannot be probed):
    every job's stretch of ports lies below 32768, where Linux's default
    ephemeral range begins, and jobs spread over the whole range."""
    bases = {slurm.auto_port_base(str(job)) for job in range(5000)}
    assert min(bases) >= 10000 and max(bases) + slurm.AUTO_PORT_STRIDE - 1 <= 32767, \
        (min(bases), max(bases))
    assert len(bases) == slurm.AUTO_PORT_SPAN // slurm.AUTO_PORT_STRIDE  # every stretch used


def test_a_port_held_over_ipv6_alone_is_busy():
    """gRPC binds `[::]:port`: a listener holding the port over IPv6 only
    (IPV6_V6ONLY, as some servers bind) makes TensorFlow fail as surely."""
    port = free_ports(1)[0]
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as holder:
        holder.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        holder.bind(("::", port))
        holder.listen()
        assert busy_ports([port]) == [port]
        assert port not in free_ports(50, among=range(port - 25, port + 25))
    assert busy_ports([port]) == []


PICKER = """
import sys
from pathlib import Path
from launcher.transport.ports import free_ports
first, last = int(sys.argv[1]), int(sys.argv[2])
print(" ".join(map(str, free_ports((last - first) // 2, among=range(first, last)))), flush=True)
sys.stdin.read()  # alive (its reservations held) until the test has both picks
"""


def test_two_launchers_picking_at_once_never_take_the_same_port(tmp_path: Path):
    """Two jobs launched together (a sweep of `--local 2` runs) each pick half
    of a window of free ports: without reservations they would share ~1/4 of
    them, and one job would lose a generation to `port_taken`."""
    window = next(range(p, p + 200) for p in AUTO_PORTS[::200]
                  if p + 200 <= AUTO_PORTS.stop and not busy_ports(range(p, p + 200)))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    pickers = [subprocess.Popen([sys.executable, "-c", PICKER, str(window.start), str(window.stop)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
               for _ in range(2)]
    try:
        picks = [set(map(int, picker.stdout.readline().split())) for picker in pickers]
    finally:
        for picker in pickers:
            picker.communicate(timeout=60)
    assert [len(p) for p in picks] == [100, 100] and not picks[0] & picks[1], picks
    assert picks[0] | picks[1] == set(window)
    # Their launchers gone, the ports are anyone's again.
    folder = tmp_path / "mgpu-launch" / "ports"
    assert len(free_ports(200, among=window, reservations=folder)) == 200


def test_a_reservation_holds_while_its_launcher_lives_and_is_young(tmp_path: Path):
    window = next(range(p, p + 5) for p in AUTO_PORTS[::5] if not busy_ports(range(p, p + 5)))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    host = socket.gethostname()
    owners = [f"{host} {gone}",      # its launcher ended: free
              f"{host} 1",           # alive, but reserved long ago: free
              f"{host} 1",           # alive and young: held
              f"elsewhere {gone}",   # another machine sharing this home: held
              ""]                    # being written: held
    for port, owner in zip(window, owners, strict=True):
        (tmp_path / str(port)).write_text(owner)
    old = time.time() - RESERVED_FOR_S - 1
    os.utime(tmp_path / str(window[1]), (old, old))
    assert sorted(free_ports(5, among=window, reservations=tmp_path))[:2] == list(window[:2])
    assert not {window[2], window[3], window[4]} & set(
        free_ports(5, among=window, reservations=tmp_path))
    # The folder cannot be made (a file in its way): ports are picked as before.
    (tmp_path / "file").write_text("")
    assert sorted(free_ports(5, among=window, reservations=tmp_path / "file" / "ports")) \
        == list(window)


FULL_DISK = """
import resource, sys
from pathlib import Path
from launcher.transport.ports import free_ports
resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))  # every write fails (EFBIG), as on a full disk
first, last, folder = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
print(" ".join(map(str, free_ports(last - first, among=range(first, last), reservations=folder))))
"""


def test_whatever_is_in_the_reservations_folder_a_launch_still_gets_its_ports(tmp_path: Path):
    """Junk planted in the folder (a FIFO that would block a read, a link, bytes
    that are no text, a pid too large), a folder another user owns, and a disk
    too full to write a reservation: the ports are picked all the same."""
    window = next(range(p, p + 5) for p in AUTO_PORTS[::5] if not busy_ports(range(p, p + 5)))
    folder = tmp_path / "ports"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / str(window[0]))
    (folder / str(window[1])).symlink_to("/dev/zero")
    (folder / str(window[2])).write_bytes(b"\xff\xfe\x00 12")
    (folder / str(window[3])).write_text(f"{socket.gethostname()} 99999999999999999999")
    # The FIFO and the link are swept at once, the pid that cannot be is gone;
    # the undecodable one, young, is held.
    assert sorted(free_ports(5, among=window, reservations=folder))[:4] == \
        [window[0], window[1], window[3], window[4]]
    assert not (folder / str(window[1])).is_symlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    full = tmp_path / "full"
    picked = subprocess.run([sys.executable, "-c", FULL_DISK, str(window.start),
                             str(window.stop), str(full)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert sorted(map(int, picked.stdout.split())) == list(window), picked.stderr
    assert list(full.iterdir()) == []  # no empty reservation left behind
    if os.geteuid() == 0:  # a folder another user made (a shared /tmp): not trusted, not used
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o777)
        os.chown(theirs, 65534, 65534)
        assert sorted(free_ports(5, among=window, reservations=theirs)) == list(window)
        assert list(theirs.iterdir()) == []
