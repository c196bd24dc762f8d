"""The views of a launch beside the terminal, made from the cluster file and
the command line: Prometheus metrics (launcher/ops/metrics.py) and
notifications (launcher/ops/notify.py). The cli makes them before the hosts are
reached (a busy metrics port is a usage error, exit 2, before anything starts)
and hands them to the launch (`Launch.start(..., views=...)`).

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

from pathlib import Path

from ..job.launch import View
from ..spec.config import LoadedConfig
from .metrics import JobMetrics, MetricsError, MetricsOutlet
from .notify import Notifier


class OutletError(Exception):
    """A view cannot be made; the message names the key or option and what to do."""


def make_views(loaded: LoadedConfig, run_dir: Path,
               metrics_port: int | None = None) -> list[View]:
    """Every view the cluster file and `--metrics-port` ask for (none: [])."""
    views: list[View] = []
    settings = loaded.config.metrics
    port = settings.port if metrics_port is None else metrics_port
    if port is not None and not 0 <= port <= 65535:
        raise OutletError(f"--metrics-port {port}: give a port from 1 to 65535 "
                          "(or 0 for any free port)")
    textfile = loaded.resolve_path(settings.textfile)
    if port is not None or textfile is not None:
        try:
            views.append(MetricsOutlet(JobMetrics(loaded.config.name), port, settings.host,
                                       textfile))
        except MetricsError as exc:
            raise OutletError(str(exc)) from None
    if loaded.config.notify is not None:
        views.append(Notifier(loaded.config.notify, loaded.config.name, run_dir))
    return views


def announcements(views: list[View]) -> list[str]:
    """What to say once the views are up (where the metrics are)."""
    lines = []
    for view in views:
        if isinstance(view, MetricsOutlet):
            if view.url:
                lines.append(f"metrics: {view.url}")
            if view.textfile:
                lines.append(f"metrics textfile: {view.textfile}")
    return lines


def metrics_of(views: list[View]) -> JobMetrics | None:
    """The job's metrics, to feed (e.g. `set_goodput`), if any are kept."""
    return next((v.metrics for v in views if isinstance(v, MetricsOutlet)), None)


def close_all(views: list[View]) -> None:
    for view in views:
        view.close()
