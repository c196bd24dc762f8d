"""The job's firewall rules on this host, as the agent keeps them.

A `start` carries the host's rules for the job's TF ports (launcher.firewall,
`security.tf_ports`): installed before the task opens its port, unless in
place; under `cluster` a failure refuses the start, under `auto` it is said
once (a notice) and tasks run open. Removed when the agent stops its tasks.

The other ports the tasks listen on (NCCL's, a profiler's, the script's own)
are found as they open (`watch`, every PORT_POLL_S: agent/listening.py),
added to the table's set of this host's ports, and told to the launcher
(`ports_opened`), which sends them to the other hosts' agents (`seal_ports`):
each host keeps its own other users off them. A port that cannot be sealed
is said (a notice), as the TF ports are.

Standard library only; of the launcher, imports firewall and the agent's
spawn and listening.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from launcher import firewall, fwrules
from launcher.agent.listening import Listening
from launcher.agent.spawn import Spawner

PORT_POLL_S = 1.0


class Seal:
    """What this host's firewall can do, and the rules in place."""

    def __init__(self, run_dir: str, spawner: Spawner, emit) -> None:
        self.run_dir = run_dir
        self.spawner = spawner  # its lock and `closing`
        self.emit = emit
        self.backend, self.why = firewall.probe()
        self.sealed: fwrules.Seal | None = None
        self.failed = ""  # `auto` and the rules failed: said once, tasks run open
        self.found: set[int] = set()  # ports the tasks opened, sealed (or said open) since
        self.peers: set[tuple[str, int]] = set()  # other hosts' such ports (seal_ports)

    def seal(self, raw: object) -> str:
        """Install the job's firewall rules for this host (`start`'s `firewall`)
        unless they are in place; returns why the task must not start, or ""."""
        if raw is None:
            return ""
        try:
            seal = fwrules.Seal.from_json(raw)
        except ValueError as exc:
            return f"refused: {exc}"
        done = peers_why = ""
        with self.spawner.lock:  # against unseal() removing the rules meanwhile
            if self.spawner.closing:
                return "the agent is stopping"
            if seal == self.sealed or (self.failed and seal.mode == "auto"):
                return ""
            why = self.why
            if self.backend is not None:
                try:
                    done = firewall.apply(seal, self.backend, self.run_dir)
                    self.sealed, self.found = seal, set()
                except firewall.FirewallError as exc:
                    why = str(exc)
            if done and self.peers:  # told before this table replaced the last one
                peers_why = self._add_peers(self.peers)
            if not done and seal.mode == "auto":
                self.failed = why
        # Said outside the lock: a write to a slow launcher must not hold up heartbeats.
        if done:
            self.emit("log", text=f"firewall: {done}")
            if peers_why:
                self.emit("log", notice=True, text=peers_why)
            return ""
        if seal.mode == "cluster":
            return (f"cannot keep the TF ports to the cluster (security.tf_ports: cluster): "
                    f"{why}; fix: {firewall.fix_for(why)}")
        self.emit("log", notice=True, text=f"TF port(s) {','.join(map(str, seal.ports))} "
                  f"open to the network (security.tf_ports: auto): {why}")
        return ""

    def unseal(self, wait: bool = True) -> None:
        """The tasks are gone: so are their ports' rules. `wait=False` (the
        agent's exit): the removal is started, not waited for (firewall.remove)."""
        with self.spawner.lock:
            firewall.reap(self.run_dir, wait=wait)
            self.sealed, self.found = None, set()

    def watch(self, pids: Callable[[], set[int]]) -> None:
        """Forever (a thread of its own): the ports the tasks (`pids`: their
        processes) listen on that are not sealed yet, sealed."""
        listening, said = Listening(time.monotonic), False
        while True:
            time.sleep(PORT_POLL_S)
            try:
                if self.sealed is not None:  # no seal (tf_ports: open): nothing read
                    self.opened(listening.ports(pids))
            except Exception as exc:  # said once; the next poll tries again
                if not said:
                    said = True
                    self.emit("log", notice=True, text="the ports the tasks open beyond "
                              f"TF_CONFIG's may stay open: {type(exc).__name__}: {exc}")

    def opened(self, ports: set[int]) -> None:
        """Seal `ports` (the tasks listen on them) where they are not yet."""
        with self.spawner.lock:
            sealed = self.sealed
            new = sorted(ports - set(sealed.ports) - self.found) if sealed else []
            if not new:
                return
            self.found.update(new)
            why = ""
            try:
                firewall.add_ports(sealed, str(self.backend), ports=new)
            except firewall.FirewallError as exc:
                why = str(exc)
        shown = ",".join(map(str, new))
        if why:
            self.emit("log", notice=True, text=f"port(s) {shown} a task opened stay open to "
                      f"the network: {why}")
            return
        self.emit("log", text=f"firewall: port(s) {shown} a task opened: sealed as the TF ports")
        for i in range(0, len(new), 1024):  # the launcher tells the other hosts
            self.emit("ports_opened", ports=new[i:i + 1024])

    def peer_ports(self, targets: list[tuple[str, int]]) -> None:
        """Other hosts' tasks opened these (address, port): this host's other
        users are kept off them too (`seal_ports` from the launcher). Host
        names are resolved first, outside the lock (a slow DNS holds no start)."""
        resolved = set(firewall.resolve_targets(targets))
        with self.spawner.lock:
            new = resolved - self.peers
            self.peers |= new
            if not new or self.sealed is None:
                return  # added with the next seal
            why = self._add_peers(new)
        if why:
            self.emit("log", notice=True, text=why)

    def _add_peers(self, targets: set[tuple[str, int]]) -> str:
        """Add other hosts' opened ports to the table (under the lock); "" or what stays open."""
        try:
            firewall.add_ports(self.sealed, str(self.backend), targets=targets)  # type: ignore[arg-type]
        except firewall.FirewallError as exc:
            shown = ", ".join(f"{a}:{p}" for a, p in sorted(targets)[:20])
            return f"other hosts' port(s) {shown} stay open to this host's other users: {exc}"
        return ""
