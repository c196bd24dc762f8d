"""The plan as `--dry-run` prints it: text or JSON, growing linearly with the hosts.

Every task's TF_CONFIG holds the whole cluster, and every host's firewall
admits every host: printed per task, 10,000 hosts would be 10^8 addresses. So
what all tasks share is printed once, then each task's own part:

- `tf_config`: the plan's `{"cluster": ...}`; each task's `{"task": {"type",
  "index"}}`. A task's TF_CONFIG is the two merged: `{**plan["tf_config"],
  **task["tf_config"]}` (its JSON with sorted keys is what the task gets).
- `env`: the plan's is what every task gets alike; each task's, what is its
  own (role, index, host, run dir, GPUs) or differs. A task's environment is
  `{**plan["env"], **task["env"]}`.
- `firewall`: the addresses every host admits once, then each host's table
  and ports.

`one_task` prints one task whole (`--dry-run --task host0/worker0`).

Pure: values in, text out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..fwrules import Seal, describe, split_families
from .plan import Plan, Task, plain
from .redact import redact_env

# Kept with each task even when every task has the same value (one task, one host).
OWN_ENV = frozenset({"MGPU_TASK_TYPE", "MGPU_TASK_INDEX", "MGPU_HOST", "MGPU_RUN_DIR",
                     "CUDA_VISIBLE_DEVICES", "KERAS_DISTRIBUTION_PROCESS_ID"})


class NoSuchTask(Exception):
    """`--task` named no task of the plan; the text lists the labels."""


def shared_env(plan: Plan) -> dict[str, str]:
    """The variables every task gets with the same value (one pass over the tasks)."""
    if not plan.tasks:
        return {}
    shared = {k: v for k, v in plan.tasks[0].env.items() if k not in OWN_ENV}
    for task in plan.tasks[1:]:
        shared = {k: v for k, v in shared.items() if task.env.get(k) == v}
    return shared


def own_env(task: Task, shared: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in task.env.items() if k not in shared}


def _cluster(plan: Plan) -> Any:
    return plain(plan.tasks[0].tf_config["cluster"]) if plan.tasks else {}


def _address_json(plan: Plan, host: str) -> dict[str, Any]:
    tf = plan.addresses.get(host)
    if tf is None:
        return {}
    return {"tf_address": tf.shown, "address_rule": tf.rule, "address_why": tf.why,
            **({"network_interface": tf.interface} if tf.interface else {})}


def _task_json(task: Task, env: Mapping[str, str], tf_config: Mapping[str, Any]) -> dict:
    return {"host": task.host, "address": task.address, "address_rule": task.address_rule,
            "role": task.role, "index": task.index, "port": task.port,
            "lifetime": task.lifetime, "cwd": task.cwd, "command": task.shell_preview(),
            "env": redact_env(dict(env)), "tf_config": tf_config}


def plan_json(plan: Plan) -> dict[str, Any]:
    """`--dry-run --json`: the shared parts once, each task's own after them."""
    shared = shared_env(plan)
    return {
        "name": plan.name, "strategy": plan.strategy, "transport": plan.transport,
        "generation": plan.generation, "run_dir": plan.run_dir,
        "checkpoint_dir": plan.checkpoint_dir,
        "hosts": [{"name": h.name, "address": h.address, "python": h.python,
                   "gpus": list(h.gpus), **_address_json(plan, h.name)} for h in plan.hosts],
        "tf_config": {"cluster": _cluster(plan)},
        "env": redact_env(shared),
        "tasks": [_task_json(t, own_env(t, shared), {"task": plain(t.tf_config["task"])})
                  for t in plan.tasks],
        "firewall": _firewall_json(plan),
    }


def dumps(value: Any, depth: int = 0) -> str:
    """JSON with the top two levels one item a line and the rest compact: a task
    or a host per line, and json's C encoder (`indent` would take the slow
    pure-Python one: seconds at 10,000 hosts)."""
    import json

    if depth >= 2 or not isinstance(value, dict | list) or not value:
        return json.dumps(value)
    pad = "  " * (depth + 1)
    if isinstance(value, list):
        items = [pad + dumps(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * depth + "]"
    items = [f"{pad}{json.dumps(k)}: {dumps(v, depth + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"


def _firewall_json(plan: Plan) -> dict[str, Any]:
    if not plan.firewall:
        return {}
    first = next(iter(plan.firewall.values()))
    return {"mode": first.mode, "allow": list(first.allow),
            "targets": [list(t) for t in first.targets],
            "hosts": {host: {"table": s.table, "chain": s.chain, "ports": list(s.ports),
                             # only where a host admits others than the rest (none today)
                             **({} if s.allow is first.allow or s.allow == first.allow
                                else {"allow": list(s.allow)})}
                      for host, s in plan.firewall.items()}}


def find_task(plan: Plan, label: str) -> Task:
    for task in plan.tasks:
        if label in (task.label, task.name) and (label == task.label or _unique(plan, label)):
            return task
    shown = ", ".join(t.label for t in plan.tasks[:6]) + (", ..." if len(plan.tasks) > 6 else "")
    raise NoSuchTask(f"--task {label}: no such task in this plan (tasks: {shown})")


def _unique(plan: Plan, name: str) -> bool:
    return sum(t.name == name for t in plan.tasks) == 1


def one_task_json(task: Task) -> dict[str, Any]:
    """One task whole: its full environment and TF_CONFIG."""
    return _task_json(task, task.env, plain(task.tf_config))


def one_task(task: Task) -> str:
    """One task whole, as text: what its process gets."""
    return "\n".join([*_task_head(task), f"  TF_CONFIG: {task.tf_config_json()}",
                      *_env_lines(task.env)])


def _task_head(task: Task) -> list[str]:
    port = f":{task.port}" if task.port else " (no port)"
    return [f"{task.label}  {task.address}{port}", f"  cwd:       {task.cwd}",
            f"  command:   {task.shell_preview()}"]


def _env_lines(env: Mapping[str, str], indent: str = "  env:       ") -> list[str]:
    return [f"{indent}{key}={value}" for key, value in redact_env(dict(env)).items()]


def memory_line(plan: Plan) -> str | None:
    """The memory tier's bound and cadence, said at the launch's start (and in
    `--dry-run`); None when it is off. A copy's size is known after the first
    save only (the agent of the chief's host says it then: agent/memcopy.py)."""
    env = shared_env(plan)
    copies = env.get("MGPU_MEMORY_COPIES")
    if not copies:
        return None
    line = (f"checkpoints at memory speed: at most {copies} copies of each task's saves in "
            "its host's /dev/shm (each host's free space is said as its first task starts)")
    if env.get("MGPU_MEMORY_PEER") == "0":
        line += "; no copy in another host's memory (a host's loss restores from the directory)"
    interval = env.get("MGPU_MEMORY_INTERVAL")
    if interval:
        line += (f"; a save to memory every {interval} steps for Keras BackupAndRestore "
                 "(ModelCheckpoint and a custom loop's CheckpointManager keep the script's "
                 "own cadence)")
    return line


def render_plan(plan: Plan) -> str:
    """The human-readable form of `--dry-run`."""
    import json

    width = max((len(name) for name in plan.addresses), default=0)
    shared = shared_env(plan)
    out = [
        f"job {plan.name!r}: strategy {plan.strategy}, transport {plan.transport}, "
        f"{len(plan.tasks)} tasks on {len(plan.hosts)} hosts, generation {plan.generation}",
        f"run dir:        {plan.run_dir}",
        f"checkpoint dir: {plan.checkpoint_dir}",
        *filter(None, [memory_line(plan)]),
        "TF_CONFIG addresses (rule: tf_address > network_interface > ssh_config > address):",
        *(f"  {name:<{width}}  {tf.shown}  [{tf.rule}: {tf.why}]"
          for name, tf in plan.addresses.items()),
        "",
        "every task's TF_CONFIG is this cluster and its own \"task\" (shown with each task; "
        "`--dry-run --task HOST/ROLEINDEX` prints one whole):",
        f"  {json.dumps({'cluster': _cluster(plan)}, sort_keys=True)}",
        "every task's environment has these, and its own (shown with each task):",
        *_env_lines(shared, "  "),
        "",
    ]
    for task in plan.tasks:
        out += _task_head(task)
        out.append(f"  TF_CONFIG task: {json.dumps(plain(task.tf_config['task']), sort_keys=True)}")
        out += _env_lines(own_env(task, shared))
        out.append("")
    out += _render_firewall(plan)
    return "\n".join(out)


def _render_firewall(plan: Plan) -> list[str]:
    if not plan.firewall:
        return ["firewall: none (security.tf_ports: open): the TF ports accept anyone "
                "who can reach them", ""]
    seals = list(plan.firewall.items())
    first_host, first = seals[0]
    out = [f"firewall (security.tf_ports: {first.mode}): each host's agent installs, before "
           "its tasks start (iptables where nft is missing; host names resolved on the host);",
           f"  {first_host}:", *(f"    {line}" for line in describe(first).splitlines())]
    v4, v6 = split_families(first.allow)
    literal = {*v4, *v6}
    names = [a for a in first.allow if a not in literal and a.lower() not in literal]
    if names:
        out.append(f"    # and the addresses {', '.join(names)} resolve to on each host")
    out.append("    # JOB_UID: the job's user on each host (its agent's uid); root is admitted too")
    if len(seals) > 1:
        out.append("  every other host: the same rules, with its own table and ports:")
        out += [f"  {host}: {_own_part(seal, first)}" for host, seal in seals[1:]]
    out.append("")
    return out


def _own_part(seal: Seal, first: Seal) -> str:
    ports = ", ".join(str(p) for p in seal.ports)
    others = "" if seal.allow is first.allow or seal.allow == first.allow else (
        f", admitting {', '.join(seal.allow)} instead")
    return f"table inet {seal.table}, set ports {{ {ports} }}{others}"
