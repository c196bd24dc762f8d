"""Which address of each host goes into TF_CONFIG, and which rule chose it.

The address SSH connects to is not always one the other hosts can use: an
alias from the launcher's ssh config means nothing to them, and a host with a
management NIC and a fast one should be reached on the fast one. The rules, the
first that applies wins:

1. `tf_address`: the host's own `tf_address:`, as written;
2. `network_interface`: the host's IPv4 address on the interface its own
   `network_interface:` names, else the top-level one; the host's agent
   reports its interfaces in its hello, so the address is known only once it
   said hello (`--dry-run` shows `<address of eth1 on gpu1>`);
3. `ssh_config`: for SSH hosts, the `HostName` the ssh config gives the host's
   `address` (behind a `ProxyJump`, the target's name as the jump host
   resolves it, never the jump host's);
4. `address`: the host's `address:`.

Pure: the ssh config's answer and the agents' hellos come in as values
(`launcher.transport.resolve.tf_addresses` reads them). Must not import:
transport, supervisor, cli.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .config import ClusterConfig
from .hosts import HostSpec

RULES = ("tf_address", "network_interface", "ssh_config", "address")


@dataclass(frozen=True)
class TFAddress:
    """Where the other hosts reach one host's tasks, and why there."""

    host: str  # the host's name
    address: str | None  # None: a network interface's, not known before the agent's hello
    rule: str  # one of RULES
    why: str  # the rule in words, for --dry-run and messages
    interface: str | None = None  # under the network_interface rule

    @property
    def shown(self) -> str:
        """The address, or what it will be once the host's agent said hello."""
        if self.address is not None:
            return self.address
        return f"<address of {self.interface} on {self.host}>"


class AddressError(Exception):
    """Hosts whose TF address cannot be known; `problems`: host -> reason.
    `addresses` holds every host's address as far as it was resolved."""

    def __init__(self, problems: Mapping[str, str],
                 addresses: Mapping[str, TFAddress] | None = None) -> None:
        self.problems = dict(problems)
        self.addresses = dict(addresses or {})
        lines = "\n".join(f"  {host}: {why}" for host, why in self.problems.items())
        count = len(self.problems)
        super().__init__(f"no TF_CONFIG address for {count} host{'s' if count > 1 else ''}:"
                         f"\n{lines}")


def host_name(spec: HostSpec) -> str:
    return spec.name or spec.address


def choose(config: ClusterConfig, spec: HostSpec, ssh_hostname: str | None = None,
           ssh_config: str = "the ssh config") -> TFAddress:
    """The rule for one host, before any agent answered. `ssh_hostname`: what the
    ssh config (the file `ssh_config`) makes of the host's address (None: not
    an SSH host, or not read)."""
    name = host_name(spec)
    if spec.tf_address:
        return TFAddress(name, spec.tf_address, "tf_address", "the host's tf_address")
    interface = spec.network_interface or config.network_interface
    if interface:
        where = "the host's" if spec.network_interface else "the top-level"
        return TFAddress(name, None, "network_interface", f"{where} network_interface",
                         interface=interface)
    if ssh_hostname and ssh_hostname != spec.address:
        return TFAddress(name, ssh_hostname, "ssh_config",
                         f"HostName of {spec.address} in {ssh_config}")
    return TFAddress(name, spec.address, "address", "the host's address")


def with_interfaces(addresses: Mapping[str, TFAddress],
                    hellos: Mapping[str, Mapping[str, Any] | None]) -> dict[str, TFAddress]:
    """`addresses` with each network interface's address filled in from its
    host's hello (`interfaces`: name -> IPv4 addresses; the first is taken).

    Hosts without a hello in `hellos` stay as they are. Raises AddressError
    naming every host whose interface is missing or has no IPv4 address, with
    the interfaces that host does have.
    """
    out = dict(addresses)
    problems: dict[str, str] = {}
    for name, tf in addresses.items():
        hello = hellos.get(name)
        if tf.rule != "network_interface" or tf.interface is None or hello is None:
            continue
        interfaces = hello.get("interfaces")
        found = interfaces.get(tf.interface) if isinstance(interfaces, dict) else None
        if isinstance(found, list) and found:
            out[name] = replace(tf, address=str(found[0]))
        elif not isinstance(interfaces, dict) or not interfaces:
            problems[name] = (f"the address of {tf.interface} ({tf.why}) is not known: the "
                              "agent could not list the host's interfaces; set `tf_address:` "
                              "for this host")
        elif tf.interface in interfaces:
            problems[name] = (f"its interface {tf.interface} has no IPv4 address (is it up?); "
                              f"the host has {describe_interfaces(interfaces)}")
        else:
            problems[name] = (f"it has no network interface {tf.interface} ({tf.why}); "
                              f"it has {describe_interfaces(interfaces)}")
    if problems:
        raise AddressError(problems, out)
    return out


def describe_interfaces(interfaces: Mapping[str, Any]) -> str:
    """`lo (127.0.0.1), eth0 (10.0.0.5), ib0 (no IPv4)`."""
    parts = []
    for name, ips in interfaces.items():
        shown = ", ".join(str(ip) for ip in ips) if isinstance(ips, list) and ips else "no IPv4"
        parts.append(f"{name} ({shown})")
    return ", ".join(parts)
