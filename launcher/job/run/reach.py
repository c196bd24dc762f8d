"""Reaching a job's hosts: from a loaded config to connected agents.

The steps a run (launcher/job/run/launch.py) and `mgpu-launch check` share, so
they can never disagree: the host targets, each host's TF_CONFIG address
(`Addresses`: planned before any agent answered, completed by the hellos),
the job's plan of a generation (ports picked as a launch picks them), the
connect through a `Transport` and, once the hellos are in, generation 0's plan
again with the addresses of named network interfaces.

Must not import: supervisor (`check` reaches hosts through here and never
trains), views, commands, cli.
"""

from __future__ import annotations

import os
import queue
import secrets
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...spec.addresses import AddressError, TFAddress, with_interfaces
from ...spec.config import LoadedConfig
from ...spec.plan import HostTarget, Plan, build_plan, host_targets, ports_needed
from ...spec.transports import traits
from ...transport import AgentLink, AgentMessage, Transport
from ...transport.inbox import Inbox
from ...transport.link import close_links
from ...transport.ports import busy_ports, free_ports
from ...transport.resolve import tf_addresses


class Addresses:
    """Each host's TF_CONFIG address. `planned`: as far as known before any
    agent answered (a reconnected host is resolved from it again); `now`:
    with the interfaces' addresses the hellos brought (what plans use)."""

    def __init__(self, planned: Mapping[str, TFAddress]) -> None:
        self.planned = dict(planned)
        self.now = dict(planned)

    @classmethod
    def resolve(cls, loaded: LoadedConfig, targets: Sequence[HostTarget]) -> Addresses:
        """By the cluster file and the ssh config; raises AddressError naming
        every host whose address cannot be had (its `addresses`: the rest)."""
        return cls(tf_addresses(loaded, targets))

    def hear(self, hellos: Mapping[str, Mapping[str, Any] | None]) -> None:
        """Fill in the named interfaces of the hosts in `hellos` (host -> its
        agent's hello). Raises AddressError naming each host whose interface
        is missing; then nothing changes."""
        self.now.update(with_interfaces({h: self.planned[h] for h in hellos}, hellos))


class Reach:
    """One job's hosts from a loaded config: targets, addresses, plans, connect.

    `loaded` may be replaced before the connect (a checkpoint directory moved
    aside); every plan reads it then."""

    def __init__(self, loaded: LoadedConfig, command: Sequence[str], run_dir: str,
                 launch_cwd: str | None = None, addresses: Addresses | None = None) -> None:
        self.loaded = loaded
        self.command = list(command)
        self.run_dir = run_dir
        self.run_id = secrets.token_hex(6)  # this run's, in every generation's plan
        self.launch_cwd = launch_cwd or os.getcwd()
        self.local = traits(loaded.config.transport).simulated
        # Simulated hosts run the tasks with this machine's Python.
        self.default_python = sys.executable if self.local else "python3"
        self.targets = host_targets(loaded.config, self.default_python, loaded.base_dir)
        self.addresses = addresses or Addresses.resolve(loaded, self.targets)

    @classmethod
    def each(cls, loaded: LoadedConfig, command: Sequence[str], run_dir: str
             ) -> tuple[Reach, dict[str, str]]:
        """Like the constructor, but a host whose TF address cannot be had is
        a problem named for it (host -> reason), not an error. For `check`."""
        try:
            return cls(loaded, command, run_dir), {}
        except AddressError as exc:
            return cls(loaded, command, run_dir, addresses=Addresses(exc.addresses)), exc.problems

    def plan(self, generation: int, active_hosts: Sequence[str] | None = None,
             ports: Sequence[int] | None = None) -> Plan:
        """The plan of `generation`, picking ports as needed: `ports.base: auto`
        takes ports free here now, outside the ephemeral range (transport/ports.py);
        simulated hosts whose fixed ports are still held after a restart take fresh ones."""
        config = self.loaded.config
        needed = ports_needed(config, active_hosts)
        if ports is None and config.ports.base == "auto":
            ports = free_ports(needed)
        elif ports is None and self.local and generation > 0:
            fixed = [config.ports.base + i for i in range(needed)]
            if busy_ports(fixed):  # something still holds the old ports: take fresh ones
                ports = free_ports(needed)
        return build_plan(self.loaded, self.command, run_dir=self.run_dir, ports=ports,
                          generation=generation, default_python=self.default_python,
                          launch_cwd=self.launch_cwd, active_hosts=active_hosts,
                          addresses=self.addresses.now, run_id=self.run_id)

    def connect(self, transport: Transport, first: Plan) -> Connected:
        """Every host's agent (spares too: a spare that cannot be reached is
        better known now), or TransportError naming each host that failed.
        Raises AddressError (the agents closed) when a named interface is missing."""
        events = Inbox()  # task output bounded: a flood never hides an exit
        early = _seal_early(transport, first)
        try:
            links = transport.connect(self.targets, self.run_dir, events)
        finally:
            if early:
                transport.on_link = None  # type: ignore[attr-defined]
        connected = Connected(self, transport, links, events, first)
        try:
            self.addresses.hear(connected.hellos())
        except AddressError:
            connected.close()
            raise
        connected.plan = self._again(first)
        return connected

    def connect_each(self, transport: Transport, first: Plan
                     ) -> tuple[Connected, dict[str, list[str]]]:
        """The hosts that answered, and what is wrong with the others (host ->
        reasons): an unreachable host, a missing interface. For `check`."""
        events: queue.Queue[AgentMessage] = queue.Queue()
        links, failed = transport.connect_each(self.targets, self.run_dir, events)
        problems: dict[str, list[str]] = {}
        for problem in failed:
            problems.setdefault(problem.host, []).append(problem.reason)
        connected = Connected(self, transport, links, events, first)
        try:
            self.addresses.hear(connected.hellos())
        except AddressError as exc:
            for host, reason in exc.problems.items():
                problems.setdefault(host, []).append(reason)
            self.addresses.now.update(exc.addresses)
        connected.plan = self._again(first)
        return connected, problems

    def _again(self, first: Plan) -> Plan:
        """Generation 0 again with the interfaces' addresses, on the same ports."""
        if not first.unresolved:
            return first
        return self.plan(0, ports=[t.port for t in first.tasks if t.port])


def _seal_early(transport: Transport, first: Plan) -> bool:
    """Have each host's agent install the job's firewall rules as soon as its
    hello is in (a `seal`), not at the start after every host's hello: at 32
    simulated hosts the installs held the last task's start ~0.3-1.5 s. Only
    where the transport offers it (SSH) and the plan's rules are final (no
    address of a named interface still to hear); the start carries the same
    rules, found in place."""
    if not first.firewall or first.unresolved or not hasattr(transport, "on_link"):
        return False

    def seal(link: AgentLink) -> None:
        rules = first.firewall.get(link.host)
        if rules is not None:
            link.send({"op": "seal", "firewall": rules.to_json()})

    transport.on_link = seal  # type: ignore[attr-defined]
    return True


@dataclass
class Connected:
    """A job's agents, connected: their links (a reconnected host gets a new
    one), the queue their messages arrive on, and generation 0's plan."""

    reach: Reach
    transport: Transport
    links: dict[str, AgentLink]
    events: queue.Queue[AgentMessage] | Inbox
    plan: Plan

    def hellos(self) -> dict[str, dict[str, Any] | None]:
        return {name: link.hello for name, link in self.links.items()}

    def reconnect(self, host: str) -> AgentLink:
        """A new agent on `host`, its interface's address read again."""
        target = next(t for t in self.reach.targets if t.name == host)
        transport = self.transport
        link = transport.connect([target], self.reach.run_dir, self.events)[host]
        try:  # the same rules: an interface's address may have changed meanwhile
            self.reach.addresses.hear({host: link.hello})
        except AddressError:
            link.close()
            raise
        return link

    def close(self) -> None:
        """Every link, then the transport (agents stop their tasks when their stdin closes)."""
        close_links(self.links.values())
        self.transport.close()
