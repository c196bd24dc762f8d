"""The hosts' firewall as the launcher sees it: before a job, the preflight's
refusals and notices from the agents' hellos and `check`'s line per host;
while it runs, the ports a host's tasks opened (sealed there), for the other
hosts to seal too (`seal_ports`).

Launcher side (not shipped with the agent, as launcher.firewall is).
"""

from __future__ import annotations

from typing import Any

from launcher.firewall import fix_for, local_users


def preflight(mode: str, hellos: dict[str, dict | None]) -> tuple[list[str], list[str]]:
    """(refusals, notices) from the agents' hellos before any task starts:
    under `cluster`, each host that cannot install rules refuses the job
    (host, reason, fix); under `auto`, it gets a one-line notice."""
    refusals, notices = [], []
    if mode == "open":
        return refusals, notices
    for host, hello in hellos.items():
        info = (hello or {}).get("firewall")
        if not isinstance(info, dict) or info.get("backend"):
            continue  # an older agent says nothing: its start reports what happens
        why = str(info.get("why") or "cannot install firewall rules")
        if mode == "cluster":
            refusals.append(f"host {host} cannot keep the job's TF ports to the cluster "
                            f"(security.tf_ports: cluster): {why}\n  fix: {fix_for(why)}")
        else:
            notices.append(f"host {host}: TF ports open to its whole network ({why}); "
                           "`security: {tf_ports: open}` silences this, `cluster` requires "
                           "the seal")
    return refusals, notices


def reachability(mode: str, hello: dict) -> tuple[str, bool]:
    """(`check`'s line for one host, whether its ports would be sealed): who
    could connect to the job's TF ports, on which of the host's interfaces
    (a TF server listens on all of them)."""
    interfaces = hello.get("interfaces") if isinstance(hello.get("interfaces"), dict) else {}
    where = ", ".join(f"{name} {' '.join(map(str, ips))}"
                      for name, ips in interfaces.items() if ips) or "every interface"
    info = hello.get("firewall") if isinstance(hello.get("firewall"), dict) else {}
    if mode == "open":
        return f"open (security.tf_ports: open): anyone reaching {where}", False
    if info.get("backend"):
        who = local_users(info["uid"]) if isinstance(info.get("uid"), int) else (
            "the job's user and root")
        return (f"sealed ({info['backend']}): listening on {where}; only {who} on the host "
                "and the job's hosts may connect"), True
    why = info.get("why") or "the agent is too old to say"
    return f"OPEN ({why}): anyone reaching {where}", False


def seal_ports(plan: Any, host: str, ports: list[int]) -> dict[str, Any] | None:
    """The `seal_ports` command for the other hosts of `plan` (a Plan): `ports`,
    which a task of `host` opened, at each of its addresses (SSH and TF).
    None where the plan seals nothing (tf_ports: open)."""
    if not plan.firewall:
        return None
    addresses = {t.address for t in plan.tasks if t.host == host}
    addresses |= {h.address for h in plan.hosts if h.name == host}
    return {"op": "seal_ports",
            "targets": [[a, p] for a in sorted(addresses) if a for p in sorted(ports)]}
