"""The firewall's rules for one host of one job, rendered: pure.

A `Seal` is what one host gets (its ports, the cluster's addresses, every
host's task ports); `render_nft` and `iptables_commands` turn it into the
rules launcher/firewall.py installs on the host (what they do and why is
said there). Made by the plan on the launcher's side and sent to each agent
in its start command (`to_json` / `from_json`, checked); `describe` shows the
rules in `--dry-run`.

Shipped with the agent: standard library only (no `dataclasses`, `ipaddress`
or `socket`: every import costs start-up time on every host).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

PRIORITY = -10  # before the filter chains of firewalld, ufw, iptables-nft (priority 0)
MULTIPORT_MAX = 15  # iptables' multiport match takes at most 15 ports
# A seal admits every host of the cluster file, by SSH and TF address: 10,000
# hosts may be 20,000 addresses (the start command's 1 MiB bound comes first).
MAX_ALLOW = 65536
_TABLE = re.compile(r"^mgpu_[a-z0-9_]{1,40}$")
_CHAIN = re.compile(r"^MGPU-[0-9a-f]{10}$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]{0,252}$")
# Literal addresses, told apart without `ipaddress` or `socket`: the agent
# imports this module, and every import costs start-up time on every host.
_IPV4 = re.compile(r"^(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}$")
_IPV6 = re.compile(r"^(?=.*:)[0-9A-Fa-f:.]{2,45}$")


class Seal:
    """The rules one host gets for one job: its ports, who may connect to them.
    Immutable by convention (no `dataclasses`: see the module's docstring)."""

    __slots__ = ("table", "chain", "ports", "allow", "mode", "targets")

    def __init__(self, table: str, chain: str, ports: tuple[int, ...], allow: tuple[str, ...],
                 mode: str, targets: tuple[tuple[str, int], ...] = ()) -> None:
        self.table = table  # nft table (family inet)
        self.chain = chain  # iptables chain
        self.ports = tuple(ports)  # the job's TF ports on this host
        # The cluster's addresses (IPs or names), besides loopback. Every host's
        # seal of a plan shares one tuple (tuple() of a tuple is that tuple):
        # 10,000 hosts admitting 10,000 addresses each must not be 10^8 copies.
        self.allow = tuple(allow)
        self.mode = mode  # "auto": seal where possible; "cluster": refuse to run open
        # (address or name, port): every host's TF ports at each of its addresses,
        # which only the job's user and root on this host may connect to (one tuple
        # shared by the plan's seals, as `allow`).
        self.targets = tuple(targets)

    def _key(self) -> tuple:
        return (self.table, self.chain, self.ports, self.allow, self.mode, self.targets)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Seal) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Seal(table={self.table!r}, chain={self.chain!r}, ports={self.ports!r}, "
                f"allow={self.allow!r}, mode={self.mode!r}, targets={self.targets!r})")

    def to_json(self) -> dict[str, object]:
        return {"table": self.table, "chain": self.chain, "ports": list(self.ports),
                "allow": list(self.allow), "mode": self.mode,
                "targets": [list(t) for t in self.targets]}

    @classmethod
    def from_json(cls, data: object) -> Seal:
        """Checked: a bad field raises ValueError (the agent refuses the command)."""
        if not isinstance(data, dict):
            raise ValueError("firewall must be an object")
        table, chain, mode = data.get("table"), data.get("chain"), data.get("mode")
        ports, allow = data.get("ports"), data.get("allow")
        if not isinstance(table, str) or not _TABLE.match(table):
            raise ValueError(f"firewall table {str(table)[:60]!r} is not mgpu_<name>")
        if not isinstance(chain, str) or not _CHAIN.match(chain):
            raise ValueError(f"firewall chain {str(chain)[:60]!r} is not MGPU-<hex>")
        if mode not in ("auto", "cluster"):
            raise ValueError(f"firewall mode {str(mode)[:20]!r} is not auto or cluster")
        if (not isinstance(ports, list) or not ports or len(ports) > 1024
                or not all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)):
            raise ValueError("firewall ports must be a list of ports 1-65535")
        if not isinstance(allow, list) or len(allow) > MAX_ALLOW or not all(
                isinstance(a, str) and (is_ip(a) or _HOSTNAME.match(a)) for a in allow):
            raise ValueError("firewall allow must be a list of addresses or host names")
        targets = data.get("targets", [])  # an older launcher's: none
        if not isinstance(targets, list) or len(targets) > MAX_ALLOW or not all(
                isinstance(t, list) and len(t) == 2 and isinstance(t[0], str)
                and (is_ip(t[0]) or _HOSTNAME.match(t[0])) and isinstance(t[1], int)
                and 1 <= t[1] <= 65535 for t in targets):
            raise ValueError("firewall targets must be a list of [address, port]")
        return cls(table, chain, tuple(ports), tuple(allow), mode,
                   tuple((a, p) for a, p in targets))


def seal_for(job: str, run_dir: str, host: str, ports: Iterable[int], allow: Iterable[str],
             mode: str, targets: tuple[tuple[str, int], ...] = ()) -> Seal | None:
    """The seal of `host` in the job whose run directory is `run_dir`; None when
    `mode` is open or the host serves no port (an evaluator alone). `allow`
    given as a tuple is taken as `allowed()` made it (a plan makes it once for
    all its hosts); any other iterable is sorted and made unique here."""
    import hashlib  # here: the agent, which imports this module, never needs it

    ports = tuple(sorted(set(ports)))
    if mode == "open" or not ports:
        return None
    digest = hashlib.sha256(f"{run_dir}\0{host}".encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "_", job.lower()).strip("_")[:20] or "job"
    if type(allow) is not tuple:
        allow = allowed(allow)
    return Seal(f"mgpu_{slug}_{digest}", f"MGPU-{digest}", ports, allow, mode, targets)


def allowed(addresses: Iterable[str]) -> tuple[str, ...]:
    """A seal's `allow`: the addresses, sorted and unique, empty ones left out."""
    return tuple(sorted({a for a in addresses if a}))


# ---------------------------------------------------------------- rendering (pure)


def split_families(addresses: Iterable[str]) -> tuple[list[str], list[str]]:
    """(IPv4, IPv6) literal addresses, each sorted and unique; names are left out."""
    v4 = {a for a in addresses if _IPV4.match(a)}
    v6 = {a.lower() for a in addresses if _IPV6.match(a)}
    return sorted(v4, key=lambda a: tuple(int(part) for part in a.split("."))), sorted(v6)


def local_uids(uid: int | str) -> str:
    """The local users admitted: the job's (the agent's uid) and root."""
    return "0" if uid in (0, "0") else f"0, {uid}"


def split_targets(pairs: Iterable[tuple[str, int]]) -> tuple[list[tuple[str, int]],
                                                             list[tuple[str, int]]]:
    """(IPv4, IPv6) (address, port) pairs with literal addresses, sorted and unique."""
    pairs = set(pairs)
    v4, v6 = split_families([a for a, _ in pairs])
    order4, order6 = {a: i for i, a in enumerate(v4)}, {a: i for i, a in enumerate(v6)}
    return (sorted({(a, p) for a, p in pairs if a in order4}, key=lambda t: (order4[t[0]], t[1])),
            sorted({(a.lower(), p) for a, p in pairs if a.lower() in order6},
                   key=lambda t: (order6[t[0]], t[1])))


def render_nft(seal: Seal, addresses: Sequence[str] | None = None,
               uid: int | str = "JOB_UID",
               targets: Sequence[tuple[str, int]] | None = None) -> str:
    """The `nft -f` script that installs (or atomically replaces) the job's table.

    `addresses`: the admitted IPs (names resolved); by default the literal IPs
    of `seal.allow`. `targets`: (IP, port) of every host's TF ports (names
    resolved); by default `seal.targets`' literal ones. `uid`: the job's user on
    the host (the agent's; JOB_UID in `--dry-run`, which runs nowhere). The
    first two lines make `delete` safe when the table does not exist yet; the
    whole file is one transaction. The sets are named: the agent adds the ports
    its tasks open (`ports`) and its peers' (`cluster4`, `cluster6`) as found.
    """
    v4, v6 = split_families(seal.allow if addresses is None else addresses)
    t4, t6 = split_targets(seal.targets if targets is None else targets)
    syn = "tcp flags & (fin|syn|rst|ack) == syn"
    guard = ['        iifname "lo" return']
    if v4:
        guard.append(f"        ip saddr {{ {', '.join(v4)} }} return")
    if v6:
        guard.append(f"        ip6 saddr {{ {', '.join(v6)} }} return")
    guard.append("        counter drop")

    def named(name: str, kind: str, elements: list[str]) -> str:
        listed = f"; elements = {{ {', '.join(elements)} }}" if elements else ""
        return f"    set {name} {{ type {kind}{listed}; }}"

    return "\n".join([
        f"table inet {seal.table}",
        f"delete table inet {seal.table}",
        f"table inet {seal.table} {{",
        named("ports", "inet_service", [str(p) for p in seal.ports]),
        named("cluster4", "ipv4_addr . inet_service", [f"{a} . {p}" for a, p in t4]),
        named("cluster6", "ipv6_addr . inet_service", [f"{a} . {p}" for a, p in t6]),
        "    chain input {",
        f"        type filter hook input priority {PRIORITY}; policy accept;",
        f"        tcp dport @ports {syn} jump guard",
        "    }",
        "    chain guard {",
        *guard,
        "    }",
        "    chain output {",
        f"        type filter hook output priority {PRIORITY}; policy accept;",
        f"        oifname \"lo\" tcp dport @ports {syn} jump local",
        f"        ip daddr . tcp dport @cluster4 {syn} jump local",
        f"        ip6 daddr . tcp dport @cluster6 {syn} jump local",
        "    }",
        "    chain local {",
        f"        meta skuid {{ {local_uids(uid)} }} return",
        "        counter reject with tcp reset",
        "    }",
        "}",
        "",
    ])


def _port_groups(ports: Sequence[int]) -> list[str]:
    return [",".join(str(p) for p in ports[i:i + MULTIPORT_MAX])
            for i in range(0, len(ports), MULTIPORT_MAX)]


def _jumps(seal: Seal) -> list[list[str]]:
    """(built-in chain, rule): SYNs to the job's ports, to its INPUT guard and,
    leaving on loopback, to its OUTPUT guard of local users; every SYN leaving,
    to its chain of the job's hosts' ports (which jumps to that guard)."""
    return [rule for group in _port_groups(list(seal.ports)) for rule in (
        ["INPUT", "-p", "tcp", "--syn", "-m", "multiport", "--dports", group,
         "-j", seal.chain],
        ["OUTPUT", "-o", "lo", "-p", "tcp", "--syn", "-m", "multiport", "--dports", group,
         "-j", seal.chain + "-L"])] + [["OUTPUT", "-p", "tcp", "--syn", "-j", seal.chain + "-C"]]


def iptables_commands(seal: Seal, addresses: Sequence[str] | None = None,
                      ip6: bool = True, uid: int | str = "JOB_UID",
                      targets: Sequence[tuple[str, int]] | None = None) -> list[list[str]]:
    """The iptables (and ip6tables) commands that install the job's chains and jumps."""
    v4, v6 = split_families(seal.allow if addresses is None else addresses)
    t4, t6 = split_targets(seal.targets if targets is None else targets)
    local, hosts = seal.chain + "-L", seal.chain + "-C"
    commands = []
    for tool, admitted, pairs in (("iptables", v4, t4), ("ip6tables", v6, t6)):
        if tool == "ip6tables" and not ip6:
            continue
        commands += [[tool, "-w", "-N", seal.chain], [tool, "-w", "-F", seal.chain],
                     [tool, "-w", "-A", seal.chain, "-i", "lo", "-j", "RETURN"]]
        commands += [[tool, "-w", "-A", seal.chain, "-s", a, "-j", "RETURN"] for a in admitted]
        commands.append([tool, "-w", "-A", seal.chain, "-j", "DROP"])
        commands += [[tool, "-w", "-N", local], [tool, "-w", "-F", local]]
        commands += [[tool, "-w", "-A", local, "-m", "owner", "--uid-owner", who, "-j", "RETURN"]
                     for who in local_uids(uid).split(", ")]
        commands.append([tool, "-w", "-A", local, "-p", "tcp", "-j", "REJECT",
                         "--reject-with", "tcp-reset"])
        commands += [[tool, "-w", "-N", hosts], [tool, "-w", "-F", hosts]]
        by_address: dict[str, list[int]] = {}
        for address, port in pairs:
            by_address.setdefault(address, []).append(port)
        commands += [[tool, "-w", "-A", hosts, "-d", address, "-p", "tcp", "-m", "multiport",
                      "--dports", group, "-j", local]
                     for address, ports in by_address.items() for group in _port_groups(ports)]
        commands += [[tool, "-w", "-I", chain, "1", *rule] for chain, *rule in _jumps(seal)]
    return commands


def iptables_removal(seal: Seal, ip6: bool = True) -> list[list[str]]:
    commands = []
    for tool in ("iptables", "ip6tables") if ip6 else ("iptables",):
        commands += [[tool, "-w", "-D", chain, *rule] for chain, *rule in _jumps(seal)]
        for chain in (seal.chain, seal.chain + "-C", seal.chain + "-L"):
            commands += [[tool, "-w", "-F", chain], [tool, "-w", "-X", chain]]
    return commands


def describe(seal: Seal, backend: str = "nft") -> str:
    """The rules as a human reads them (`--dry-run`)."""
    if backend == "iptables":
        return "\n".join(" ".join(c) for c in iptables_commands(seal))
    return render_nft(seal).split("\n", 2)[2].rstrip("\n")  # without the replace preamble


def is_ip(value: str) -> bool:
    return bool(_IPV4.match(value) or _IPV6.match(value))
