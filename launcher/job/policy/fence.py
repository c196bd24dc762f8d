"""When a lost host's tasks are surely over, so that the next generation may start.

A host lost by silence (a cut link: no FIN, no RST) still runs its tasks: its
agent stops them only when its lease runs out (`restart.heartbeat_timeout_s`
of hearing nothing from the launcher), with SIGTERM and, `AGENT_EOF_GRACE_S`
later, SIGKILL (a script that catches SIGTERM, or saves on it, may run until
the SIGKILL). Until then a task behind the cut may still write to the shared
checkpoint directory (a save under way, a save on SIGTERM, a script's own
files): a new generation that restored meanwhile would find its checkpoint
moved under it. So the next generation starts no sooner than `tasks_over_by`.

The launcher cannot know when the agent last heard it, only when it last heard
the agent (`last_seen`): on a cut link both directions go at once, so the agent
heard the launcher at most one heartbeat period (plus a busy host's delay,
HEARD_AFTER_S) after that. Where the way to the agent still worked, its link's
close reached it as an EOF (same stop, same grace). A host whose connection
dropped has no lease to wait out: its agent saw the EOF, or died with it.

Pure arithmetic on the supervisor's clock; imports nothing.
"""

from __future__ import annotations

AGENT_EOF_GRACE_S = 2.0  # the agents' SIGTERM -> SIGKILL (the transports' eof_grace_s)
HEARD_AFTER_S = 2.0  # how much later than its last heartbeat an agent may have heard us
LEASE_CHECK_S = 0.2  # the agent looks at its lease this often (launcher/agent/lease.py)
KILL_SLACK_S = 0.5  # from the SIGKILL to the tasks' files closed


def tasks_over_by(*, lost_at: float, last_seen: float, lease_s: float, silent: bool,
                  grace_s: float = AGENT_EOF_GRACE_S) -> float:
    """When every task of a host lost at `lost_at` (its link closed then) is over:
    `silent`, lost by missing heartbeats (its agent's lease to run out first)."""
    stops_at = lost_at  # the agent hears the EOF, if it hears anything at all
    if silent:
        stops_at = max(stops_at, last_seen + HEARD_AFTER_S + lease_s + LEASE_CHECK_S)
    return stops_at + grace_s + KILL_SLACK_S
