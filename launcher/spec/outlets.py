"""Where a job's story goes besides the terminal: the cluster file's `metrics:`
and `notify:` sections (docs/operations.md, "Metrics" and "Notifications").

Owns: their schema and defaults, checked like every other section (unknown
keys, types, ranges: launcher.spec.problems words them with the file and line).
The outlets that use them are made in launcher/outlets/launch.py.

Must not import: anything of the launcher but launcher.spec.strict.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .strict import Strict

# What `notify.events` may name: a job's end (failed, succeeded, stopped), a
# restart, a straggler named, a loss gone non-finite (the NaN sentinel's), a
# loss spike; all but the spikes by default (a spike alone changes nothing).
NOTIFY_EVENTS = ("failed", "restarted", "succeeded", "stopped", "straggler", "nonfinite")
NotifyEvent = Literal["failed", "restarted", "succeeded", "stopped", "straggler", "nonfinite",
                      "loss_spike"]


class MetricsSettings(Strict):
    # Prometheus text served while the job runs (None: not served; 0: any free port).
    port: int | None = Field(default=None, ge=0, le=65535)
    # The address it is served on: this machine only unless said otherwise.
    host: str = Field(default="127.0.0.1", min_length=1)
    # The same text written for node_exporter's textfile collector (a *.prom file).
    textfile: str | None = None

    @field_validator("textfile")
    @classmethod
    def _prom(cls, value: str | None) -> str | None:
        if value is not None and not value.endswith(".prom"):
            raise ValueError("node_exporter's textfile collector reads only files named "
                             f"*.prom: name it e.g. {value.rstrip('/')}.prom")
        return value


class NotifySettings(Strict):
    # Run on the launcher's machine through `sh -c`, the event as a JSON line on stdin.
    command: str = Field(min_length=1)
    events: list[NotifyEvent] = Field(default_factory=lambda: list(NOTIFY_EVENTS),
                                      min_length=1)
    # A command still running after this is killed (and that is recorded).
    timeout_s: float = Field(default=30.0, gt=0, le=3600)

    @field_validator("command")
    @classmethod
    def _no_blank_command(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the command is empty: give the shell command to run")
        return value
