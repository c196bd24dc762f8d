"""`mgpu-launch check --json`: the check's verdict for automation (CI, a Kubernetes init step).

Owns the JSON shape of a check, one object on standard output:

- `ready` (bool) and `verdict` (`ready` | `not_ready`): the exit code's meaning
  (0 ready, 2 not);
- `hosts`: one object per host, what the table shows, as values (`reached`,
  versions, `ports`, `busy_ports`, `peers`, `checkpoint`, `gpus`, `login_s`,
  `tf_ports`, `problems`);
- `problems`: one object per problem, `{host, problem}`, the lines of the text's
  `problems:` block;
- `checkpoint_dir`, and `collective` (the mini job: `ok`, `skipped`, `cause`,
  `wall_s`, one object per task) or null;
- `error`: set instead of the hosts when the check could not run (a bad cluster
  file, no allocation, a job that cannot be planned).

A view of launcher.commands.check's reports: it decides nothing.

Must not import: supervisor, transport.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..job.run.check_collective import CollectiveReport

SCHEMA = 1  # `v`: bumped when a field changes meaning


def host_object(report: Any) -> dict[str, Any]:
    """One host of a check (`report`: a launcher.commands.check_verdict.HostReport)."""
    hello = report.hello
    return {
        "host": report.host.name,
        "address": report.host.address,
        "reached": hello is not None,
        "python": hello.get("python_version") if hello else None,
        "packages": dict(report.packages()),
        "keras_backend": report.keras_backend,
        "jax": dict(report.jax),
        "ports": list(report.ports),
        "busy_ports": dict(report.busy),
        "peers": dict(report.peers),
        "checkpoint": dict(report.checkpoint),
        "gpus": report.gpus,
        "login_s": report.login_s,
        "tf_ports": report.tf_ports or None,
        "problems": list(report.problems),
    }


def collective_object(collective: CollectiveReport | None) -> dict[str, Any] | None:
    if collective is None:
        return None
    return {
        "strategy": collective.strategy, "what": collective.what, "ok": collective.ok,
        "skipped": collective.skipped, "cause": collective.cause or None,
        "wall_s": round(collective.wall_s, 3),
        "tasks": [{"task": p.task.name, "host": p.task.host, "succeeded": p.succeeded,
                   "failed": p.failed, "timed_out": p.timed_out, "error": p.error or None}
                  for p in collective.probes],
    }


def verdict(reports: Sequence[Any], checkpoint_dir: str,
            collective: CollectiveReport | None) -> dict[str, Any]:
    problems = [{"host": r.host.name, "problem": p} for r in reports for p in r.problems]
    return {
        "v": SCHEMA,
        "ready": not problems,
        "verdict": "ready" if not problems else "not_ready",
        "checkpoint_dir": checkpoint_dir,
        "hosts": [host_object(r) for r in reports],
        "problems": problems,
        "collective": collective_object(collective),
    }


def error(message: str) -> str:
    """The check could not run: not ready, and why."""
    return json.dumps({"v": SCHEMA, "ready": False, "verdict": "not_ready", "error": message,
                       "hosts": [], "problems": []})


def dumps(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, default=str)
