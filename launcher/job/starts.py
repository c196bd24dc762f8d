"""A task's start, as its agent is told it (`start`).

One builder for the supervisor's starts and for generation 0's tasks started
at their host's hello (job/reach.py: `prestart`), so that the two never
differ. Pure.
"""

from __future__ import annotations

from typing import Any

from ..spec.plan import Plan, Task


def start_command(plan: Plan, task: Task, warm_standby: str) -> dict[str, Any]:
    """The `start` command of `task` in `plan`'s generation."""
    seal = plan.firewall.get(task.host)
    return {
        "op": "start",
        "task": task.name,
        "generation": plan.generation,
        "argv": list(task.argv),
        "cwd": task.cwd,
        "env": dict(task.env),
        "tf_config": task.tf_config_json(),
        "standby": warm_standby,
        # The host's firewall rules for the job's ports (launcher.firewall).
        "firewall": seal.to_json() if seal else None,
    }
