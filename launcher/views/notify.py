"""Notifications in words: which events are a notification (`notify:` of the
cluster file: failed, restarted, succeeded, stopped, straggler, nonfinite,
loss_spike; docs/operations.md, "Notifications") and the JSON line a
notification command reads on its stdin (the event's events.jsonl line plus
`notify`, `job`, `run_dir`).

A rendering only: the command's process, its queue and its thread are
launcher/outlets/notify.py's.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..job.record import events as ev
from ..job.record.story import kind_of

_JOB_END = {"succeeded": "succeeded", "failed": "failed", "interrupted": "stopped"}


def notification(event: ev.Event) -> str | None:
    """The notification an event is (failed, restarted, ...), or None."""
    if isinstance(event, ev.JobDone):
        return _JOB_END.get(event.status, "failed")
    if isinstance(event, ev.Restart | ev.TaskRestarted):  # the job, or a PS worker alone
        return "restarted"
    if kind_of(event) == "straggler":
        return "straggler"
    if isinstance(event, ev.Nonfinite):  # the NaN sentinel's: the loss went bad at a step
        return "nonfinite"
    if isinstance(event, ev.LossSpike):  # not by default (spec/outlets.py)
        return "loss_spike"
    return None


def notification_line(event: ev.Event, name: str, job: str, run_dir: Path, now: float) -> str:
    """The one JSON line the command reads: the event as events.jsonl has it
    (`now` when the event carries no time), `notify`, `job` and `run_dir`."""
    line = {**ev.to_record(event, event.t if event.t is not None else now),
            **event.extra, "notify": name, "job": job, "run_dir": str(run_dir)}
    return json.dumps(line, default=str)
