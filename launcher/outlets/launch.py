"""The outlets of a launch beside the terminal, made from the cluster file and
the command line: Prometheus metrics (launcher/outlets/metrics.py, serving
launcher/views/metrics.py's families) and notifications
(launcher/outlets/notify.py, running the commands of launcher/views/notify.py's
notifications). The run command makes them before the hosts are
reached (a busy metrics port is a usage error, exit 2, before anything starts)
and hands them to the launch (`Launch.start(..., views=outlets.views)`).

metrics and notify are imported only when a job asks for them: every command
imports the cli, and prometheus-client is not free to import.

Must not import: cli (it imports the launch, for its `View`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..job.run.launch import View
from ..spec.config import LoadedConfig

if TYPE_CHECKING:
    from ..views.metrics import JobMetrics


class OutletError(Exception):
    """A view cannot be made; the message names the key or option and what to do."""


@dataclass
class Outlets:
    views: list[View] = field(default_factory=list)  # for Launch.start
    said: list[str] = field(default_factory=list)  # where the metrics are, to say once
    metrics: JobMetrics | None = None  # to feed beside the events (`set_goodput`)
    metrics_port: int | None = None  # the port served (chosen here for port 0)

    def close(self) -> None:
        """Views never opened (a launch that ended early, or the --detach parent)."""
        for view in self.views:
            view.close()


def make_outlets(loaded: LoadedConfig, run_dir: Path,
                 metrics_port: int | None = None) -> Outlets:
    """Every view the cluster file and `--metrics-port` ask for (maybe none)."""
    made = Outlets()
    settings = loaded.config.metrics
    port = settings.port if metrics_port is None else metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise OutletError(f"--metrics-port {port}: give a port from 1 to 65535 "
                          "(or 0 for any free port)")
    textfile = loaded.resolve_path(settings.textfile)
    if port is not None or textfile is not None:
        from ..views.metrics import JobMetrics
        from .metrics import MetricsError, MetricsOutlet

        try:
            outlet = MetricsOutlet(JobMetrics(loaded.config.name), port, settings.host,
                                   textfile)
        except MetricsError as exc:
            raise OutletError(str(exc)) from None
        made.views.append(outlet)
        made.metrics = outlet.metrics
        made.metrics_port = outlet.port
        made.said += [f"metrics: {outlet.url}"] if outlet.url else []
        made.said += [f"metrics textfile: {textfile}"] if textfile else []
    if loaded.config.notify is not None:
        from .notify import Notifier

        made.views.append(Notifier(loaded.config.notify, loaded.config.name, run_dir))
    return made
