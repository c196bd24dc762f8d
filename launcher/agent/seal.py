"""The job's firewall rules on this host, as the agent keeps them.

A `start` carries the host's rules for the job's TF ports (launcher.firewall,
`security.tf_ports`): installed before the task opens its port, unless in
place; under `cluster` a failure refuses the start, under `auto` it is said
once (a notice) and tasks run open. Removed when the agent stops its tasks.

Standard library only; of the launcher, imports firewall and the agent's spawn.
"""

from __future__ import annotations

from launcher import firewall
from launcher.agent.spawn import Spawner


class Seal:
    """What this host's firewall can do, and the rules in place."""

    def __init__(self, run_dir: str, spawner: Spawner, emit) -> None:
        self.run_dir = run_dir
        self.spawner = spawner  # its lock and `closing`
        self.emit = emit
        self.backend, self.why = firewall.probe()
        self.sealed: firewall.Seal | None = None
        self.failed = ""  # `auto` and the rules failed: said once, tasks run open

    def seal(self, raw: object) -> str:
        """Install the job's firewall rules for this host (`start`'s `firewall`)
        unless they are in place; returns why the task must not start, or ""."""
        if raw is None:
            return ""
        try:
            seal = firewall.Seal.from_json(raw)
        except ValueError as exc:
            return f"refused: {exc}"
        done = ""
        with self.spawner.lock:  # against unseal() removing the rules meanwhile
            if self.spawner.closing:
                return "the agent is stopping"
            if seal == self.sealed or (self.failed and seal.mode == "auto"):
                return ""
            why = self.why
            if self.backend is not None:
                try:
                    done = firewall.apply(seal, self.backend, self.run_dir)
                    self.sealed = seal
                except firewall.FirewallError as exc:
                    why = str(exc)
            if not done and seal.mode == "auto":
                self.failed = why
        # Said outside the lock: a write to a slow launcher must not hold up heartbeats.
        if done:
            self.emit("log", text=f"firewall: {done}")
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
            self.sealed = None
