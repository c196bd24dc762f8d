"""`ports.base: auto`'s ports (launcher/transport/ports.py): free, distinct, and
outside the kernel's ephemeral range, where an outgoing connection could take
one before TensorFlow binds it."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

from launcher.job.run.launch import Launch
from launcher.spec import slurm
from launcher.spec.config import local_config
from launcher.transport.ports import AUTO_PORTS, busy_ports, ephemeral_range, free_ports


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
