"""When a stopped task is a hang: the launcher's own bound on a frozen process.

A task frozen by SIGSTOP, Ctrl-Z or a debugger shows as `stopped` in its
agent's heartbeats (one a second). A freeze of a few seconds is no failure: a
VM pause, a swap storm or a starved host stops a process for seconds and lets
it go on, and TensorFlow's collectives simply wait for it. A task seen stopped
without a break for longer than `STOPPED_HANG_S` is hung: its peers cannot go
on without it, and the job is restarted (its peers' stacks taken first).

The span is measured on the agent's own clock (the heartbeats' `t`), so a
heartbeat delivered late by a loaded machine or network never lengthens it.
TensorFlow's coordination heartbeat (`MGPU_TF_HEARTBEAT_S`, set by the plan to
`TF_HEARTBEAT_S` in spec/taskenv.py) is kept well above this bound: it is the fallback for a hang
no agent can see (a host cut off), and it must not take a short freeze of the
coordination leader itself for a death (a peer's heartbeat is up to half the
timeout old when the freeze begins).

Pure: no clock, no I/O; the supervisor feeds it heartbeats.
"""

from __future__ import annotations

# A task seen stopped this long (agent clock) is hung. Freezes up to 5 s must
# pass (issue 24); with heartbeats a second apart a hang is seen within ~8 s.
STOPPED_HANG_S = 7.0


class StoppedWatch:
    """Since when (agent clock) each task has been seen stopped without a break."""

    def __init__(self, limit_s: float = STOPPED_HANG_S) -> None:
        self.limit_s = limit_s
        self._since: dict[str, float] = {}

    def observe(self, task: str, status: object, t: object) -> float:
        """One heartbeat's view of `task`; how long it has been stopped (0: running)."""
        if status != "stopped" or not isinstance(t, int | float):
            self._since.pop(task, None)
            return 0.0
        since = self._since.setdefault(task, float(t))
        return max(0.0, float(t) - since)

    def hung(self, task: str, status: object, t: object) -> float | None:
        """The stopped span when it passed the bound, else None."""
        span = self.observe(task, status, t)
        return span if span > self.limit_s else None
