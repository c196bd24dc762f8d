"""Keep TensorFlow's unauthenticated gRPC ports to the job's own hosts.

A TensorFlow server listens on every interface, with no authentication and no
encryption: whoever reaches a worker's port can run graph operations on it
(TensorFlow's own advice is a private network, tensorflow#11689). With
`security: {tf_ports: auto | cluster}` each host's agent, before its tasks
start, installs one firewall table for this job on this host:

- nftables: `table inet mgpu_<job>_<digest>` whose input chain hooks at
  priority -10 (before the usual filter chains at 0). A new TCP connection
  (SYN) to one of the job's ports here (set `ports`) jumps to a guard chain
  that returns for loopback and the cluster's addresses and drops the rest.
  Those are the hosts' own users: its output chain (same priority) answers a
  SYN with a TCP reset unless the sending socket is owned by the job's user
  (the agent's uid: its tasks are its children) or root (`meta skuid`; root
  can remove any rule, so keeping it out would be for show), when it goes to
  the job's ports here over `lo` (a connection to this host's own address
  leaves on `lo` too), or to any host's task ports at that host's addresses
  (sets `cluster4`, `cluster6`: every host has the same, so another user of
  any host is refused at their own). The agent adds the ports its tasks open
  later to `ports`, and other hosts' to `cluster4/6` (`add_ports`). Nothing
  else is matched: other ports, replies, UDP. A
  drop is final in netfilter but an accept is not: this table can only close
  the job's ports. Sent over netlink (nftlink; `nft -f` where that fails).
- iptables (no `nft`): a chain `MGPU-<digest>` with the same guard, jumped to
  from the top of INPUT for SYNs to the job's ports, and `MGPU-<digest>-L`
  (`-m owner --uid-owner`) from the top of OUTPUT, directly for `lo` and
  through `MGPU-<digest>-C` for the hosts' ports (ip6tables too when there);
  TF_CONFIG's ports only.

The table's name comes from the job's run directory and the host: two jobs
(or simulated hosts on one machine) never touch each other's rules. What was
installed is recorded in `RUN_DIR/firewall.json`: the agent removes it when its
tasks end, the next agent of the run directory what a killed one left.
The rules are rendered by launcher/fwrules.py (pure); `probe`, `apply`,
`remove`, `reap` here run `nft`/`iptables` (an injectable runner). Shipped
with the agent: standard library only (and fwrules, nftlink; fwregistry:
what the agents installed on this machine, for `sweep`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable

from launcher import fwregistry, nftlink
from launcher.fwrules import (
    PRIORITY,
    Seal,
    iptables_commands,
    iptables_removal,
    is_ip,
    render_nft,
    split_families,
    split_targets,
)

MODES = ("auto", "cluster", "open")
RECORD = "firewall.json"
CAP_NET_ADMIN = 12  # bit in /proc/self/status CapEff (linux/capability.h)
TOOL_TIMEOUT_S = 10.0  # nft/iptables take milliseconds; `-w` waits for the xtables lock
NFT_LOCK_WAIT_S = 10.0  # nft removals take turns (_nft_lock); past this wait, unlocked
# Where firewall tools live; an SSH session of a non-root user often lacks sbin in PATH.
SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")

Runner = Callable[[list[str], str | None], tuple[int, str]]


class FirewallError(Exception):
    """The rules could not be installed or removed; the text says why."""


# ---------------------------------------------------------------- the host's side


def _tool(name: str) -> str | None:
    """The executable `name` on PATH or in an sbin folder (not `shutil`: every
    import costs start-up time on every host)."""
    for folder in [*os.environ.get("PATH", "").split(os.pathsep), *SBIN]:
        path = os.path.join(folder, name)
        if folder and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _has_net_admin() -> bool:
    """CAP_NET_ADMIN in effect: root in a container may lack it, a user may hold it."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return os.geteuid() == 0  # no /proc (not Linux): nft/iptables would say


def probe() -> tuple[str | None, str]:
    """(backend, why not): "nft" or "iptables" when this process can install
    rules, else None and the reason. Reads files only; runs nothing."""
    if not _has_net_admin():
        return None, (f"the agent runs as {'root' if os.geteuid() == 0 else 'a user'} "
                      "without CAP_NET_ADMIN")
    if _tool("nft"):
        return "nft", ""
    if _tool("iptables"):
        return "iptables", ""
    return None, "neither nft nor iptables is installed"


def _run(argv: list[str], stdin: str | None, in_turn: bool = False) -> tuple[int, str]:
    """Run a firewall tool; `in_turn`: an `nft` waits for the ruleset's lock first."""
    tool = _tool(argv[0]) or argv[0]
    lock = _nft_lock() if in_turn and argv[0] == "nft" else None
    try:
        deadline = time.monotonic() + NFT_LOCK_WAIT_S
        while lock is not None and not _locked(lock) and time.monotonic() < deadline:
            time.sleep(0.005)  # past the deadline, unlocked: nft is correct so, only slower
        done = subprocess.run([tool, *argv[1:]], input=stdin, capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    finally:
        if lock is not None:
            os.close(lock)
    return done.returncode, (done.stderr or done.stdout).strip()


_run_in_turn: Runner = functools.partial(_run, in_turn=True)  # removals (see _nft_lock)


def _nft_lock() -> int | None:
    """An fd of the ruleset's lock file (per user, machine and network namespace),
    or None: racing `nft` removals restart (32 at once: 1.2-1.4 s of CPU, in turn 0.26 s)."""
    return fwregistry.lock_file()


def _locked(fd: int) -> bool:
    """Took the lock, or a lock that cannot work here (True); must wait (False)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # no locks on this filesystem: go on
        pass
    return True


def resolve(allow: Iterable[str]) -> tuple[list[str], list[str]]:
    """(addresses, names that did not resolve): names resolved here, on the host."""
    addresses, missing = [], []
    for entry in allow:
        if is_ip(entry):
            addresses.append(entry)
            continue
        import socket  # only for names: literal addresses need none

        try:
            infos = socket.getaddrinfo(entry, None, proto=socket.IPPROTO_TCP)
        except OSError:
            missing.append(entry)
            continue
        addresses += sorted({str(info[4][0]).split("%")[0] for info in infos})
    return addresses, missing


def resolve_targets(targets: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """(IP, port): names resolved here (one that does not resolve is left out:
    `resolve` of `allow`, which names the same hosts, says so)."""
    found: dict[str, list[str]] = {}
    pairs = []
    for address, port in targets:
        if address not in found:
            found[address] = resolve([address])[0]
        pairs += [(ip, port) for ip in found[address]]
    return pairs


def apply(seal: Seal, backend: str, run_dir: str, run: Runner = _run) -> str:
    """Install `seal` (replacing this job's earlier rules) and record it; returns
    a one-line description. Raises FirewallError with the reason."""
    addresses, missing = resolve(seal.allow)
    targets = resolve_targets(seal.targets)
    old = read_record(run_dir)
    if old is not None and old.get("backend") != "nft":
        remove(old, run)  # an earlier generation's jumps name other ports
    record = {"backend": backend, **seal.to_json()}
    _write_record(run_dir, record)  # first: a kill leaves it, for the next agent
    fwregistry.register(seal.table, run_dir, record)  # for any agent, if no next one comes
    uid = os.getuid()  # the job's user: the agent's, whose children the tasks are
    if backend == "nft":
        try:  # over netlink: `nft` would first read every table on the host (nftlink)
            nftlink.install(seal.table, seal.ports, *split_families(addresses), (0, uid),
                            PRIORITY, split_targets(targets))
        except OSError:  # no netlink here, or the kernel refused: `nft`, which says why
            code, out = run(["nft", "-f", "-"], render_nft(seal, addresses, uid, targets))
            if code != 0:
                raise FirewallError(f"nft refused the rules: {out[-300:]}") from None
    else:
        ip6 = _tool("ip6tables") is not None
        for command in iptables_commands(seal, addresses, ip6, uid, targets):
            code, out = run(command, None)
            if code != 0:
                raise FirewallError(f"{' '.join(command)} failed: {out[-300:]}")
    ports = ",".join(str(p) for p in seal.ports)
    where = f"table inet {seal.table}" if backend == "nft" else f"chain {seal.chain}"
    unresolved = f"; {', '.join(missing)} did not resolve here" if missing else ""
    return (f"TF port(s) {ports} accept only {local_users(uid)} on this host and "
            f"{len(set(addresses))} cluster address(es) ({backend} {where}){unresolved}")


def add_ports(seal: Seal, backend: str, ports: Iterable[int] = (),
              targets: Iterable[tuple[str, int]] = ()) -> None:
    """Seal more ports in the job's installed table: `ports` of this host's tasks
    (set `ports`), `targets` of other hosts' (address or name, port; sets
    cluster4/6). nft only: FirewallError with the reason where they stay open."""
    if backend != "nft":
        raise FirewallError("the iptables rules seal only the TF_CONFIG ports")
    ports, (t4, t6) = sorted(set(ports)), split_targets(resolve_targets(targets))
    for name, keys, shown in (
            ("ports", [nftlink.port_key(p) for p in ports], [str(p) for p in ports]),
            ("cluster4", [nftlink.target_key(a, p) for a, p in t4], [f"{a} . {p}" for a, p in t4]),
            ("cluster6", [nftlink.target_key(a, p) for a, p in t6], [f"{a} . {p}" for a, p in t6])):
        if not keys:
            continue
        try:
            nftlink.add_elements(seal.table, name, keys)
        except OSError:  # as apply: `nft`, which says why
            code, out = _run(["nft", "add", "element", "inet", seal.table, name,
                              "{ " + ", ".join(shown) + " }"], None)
            if code != 0:
                raise FirewallError(f"nft refused: {out[-300:]}") from None


def local_users(uid: object) -> str:
    """Who on the host may connect, in words."""
    return "root" if uid == 0 else f"uid {uid} (the job's user) and root"


def run_detached(argv: list[str], stdin: str | None) -> tuple[int, str]:
    """Start the command in a session of its own, output to /dev/null; 0 once started.
    An `nft` (a removal) takes the ruleset's lock first (`flock`, where installed)."""
    command, flock = [_tool(argv[0]) or argv[0], *argv[1:]], _tool("flock")
    lock = _nft_lock() if flock and argv[0] == "nft" else None
    if lock is not None:  # the child takes the lock (util-linux flock), then is nft
        command = ["/bin/sh", "-c", f'{flock} -w {NFT_LOCK_WAIT_S:g} {lock}; exec "$@"',
                   "sh", *command]
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                pass_fds=() if lock is None else (lock,))
        with proc.stdin:  # type: ignore[union-attr]
            proc.stdin.write((stdin or "").encode())  # type: ignore[union-attr]
    except OSError as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    finally:
        if lock is not None:
            os.close(lock)
    return 0, ""


def remove(record: dict, run: Runner = _run_in_turn, wait: bool = True) -> str:
    """Remove what `record` (from RUN_DIR/firewall.json) installed; "" when there
    was nothing, else what was removed. Never raises. `wait=False` (the agent's
    last act): an nft table's removal is started, not waited for (nftlink.delete)."""
    try:
        seal = Seal.from_json({**record, "mode": "cluster"})
    except ValueError:
        return ""
    if record.get("backend") == "nft":
        with contextlib.suppress(OSError):  # over netlink; else `nft`, as in apply
            gone = nftlink.delete(seal.table, wait, _tool("nft"))
            return f"table inet {seal.table}" if gone else ""
        code, _ = (run if wait else run_detached)(["nft", "-f", "-"],
                                                  f"delete table inet {seal.table}\n")
        return f"table inet {seal.table}" if code == 0 else ""
    removed = False
    for command in iptables_removal(seal, _tool("ip6tables") is not None):
        removed = run(command, None)[0] == 0 or removed
    return f"chain {seal.chain}" if removed else ""


def reap(run_dir: str, run: Runner = _run_in_turn, wait: bool = True) -> str:
    """Remove the rules an earlier agent of `run_dir` recorded (and the record);
    `wait`: see `remove`."""
    record = read_record(run_dir)
    if record is None:
        return ""
    removed = remove(record, run, wait)
    try:
        os.unlink(os.path.join(run_dir, RECORD))
    except OSError:
        pass
    fwregistry.unregister(record.get("table"))
    return removed


# ---------------------------------------------------------------- the sweep


def sweep(run: Runner = _run_in_turn) -> list[str]:
    """Remove the rules of agents here that are gone (fwregistry); what was removed."""
    removed = []
    for path, pid, record in fwregistry.gone():
        what = remove(record, run)
        if what:
            removed.append(f"{what}, agent pid {pid}")
        try:
            os.unlink(path)
        except OSError:
            pass
    return removed


def read_record(run_dir: str) -> dict | None:
    try:
        with open(os.path.join(run_dir, RECORD), "rb") as handle:
            record = json.loads(handle.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _write_record(run_dir: str, record: dict) -> None:
    path = os.path.join(run_dir, RECORD)
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


def fix_for(why: str) -> str:
    """What the user can do when a host cannot seal its ports."""
    if "CAP_NET_ADMIN" in why:
        return ("give the agent CAP_NET_ADMIN: log in as root (`ssh.user: root`; in a "
                "container, `--cap-add NET_ADMIN`) or `sudo setcap cap_net_admin+ep` on the "
                "host's python; or set `security: {tf_ports: open}` on a private network")
    if "installed" in why:
        return "install nftables (apt install nftables), or set `security: {tf_ports: open}`"
    return "fix the host's firewall tool, or set `security: {tf_ports: open}`"
