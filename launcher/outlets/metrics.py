"""The job's Prometheus metrics leave the process here (`--metrics-port`,
`metrics:` in the cluster file; docs/operations.md, "Metrics"): the text of a
`launcher.views.metrics.JobMetrics` served by prometheus-client's own HTTP
server on its own thread, and/or written for node_exporter's textfile
collector (tmp file + rename) every `TEXTFILE_EVERY_S` by a thread of its own,
and once more at the end.

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import start_http_server
from prometheus_client.exposition import write_to_textfile

from ..job.record import events as ev
from ..views.metrics import JobMetrics

# How often the textfile is rewritten while the job runs.
TEXTFILE_EVERY_S = 5.0


class MetricsError(Exception):
    """The metrics cannot be served or written; the message says why and what to do."""


class MetricsOutlet:
    """Serves and/or writes a `JobMetrics` while the job runs (a view of the
    launch: `open` before the supervisor starts, `close` after it ends)."""

    def __init__(self, metrics: JobMetrics, port: int | None, host: str,
                 textfile: Path | None) -> None:
        self.metrics = metrics
        self.textfile = textfile
        self.url: str | None = None
        self.port: int | None = None  # the port bound (the one chosen, for port 0)
        self._server = None
        self._stop = threading.Event()
        self._writer: threading.Thread | None = None
        self._opened = False
        self._announced = False
        self._record: Callable[[ev.Event], None] = lambda _event: None
        if textfile is not None and not textfile.parent.is_dir():
            raise MetricsError(f"metrics.textfile: folder {textfile.parent} does not exist "
                               "(node_exporter's --collector.textfile.directory)")
        if port is not None:
            self._serve(port, host)

    def _serve(self, port: int, host: str) -> None:
        try:
            self._server, _thread = start_http_server(port, addr=host,
                                                      registry=self.metrics.registry)
        except OSError as exc:
            why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be served: {exc}"
            raise MetricsError(
                f"metrics port {port} on {host} {why}: give another --metrics-port (or "
                "`metrics: {port: ...}`), or 0 for any free port") from None
        bound = self._server.server_address
        shown = f"[{bound[0]}]" if ":" in str(bound[0]) else bound[0]
        self.url = f"http://{shown}:{bound[1]}/metrics"
        self.port = int(bound[1])

    def tell(self, event: ev.Event) -> None:
        self.metrics.tell(event)
        if isinstance(event, ev.Launch) and not self._announced:
            self._announced = True  # in the run directory too: `status` says the port
            self._record(ev.MetricsServed(url=self.url, textfile=str(self.textfile)
                                          if self.textfile is not None else None))

    def set_goodput(self, parts: Mapping[str, float], wall_s: float | None = None,
                    productive_s: float | None = None) -> None:
        self.metrics.set_goodput(parts, wall_s, productive_s)

    def open(self, record: Callable[[ev.Event], None]) -> None:
        self._opened = True
        self._record = record
        if self.textfile is not None:
            self._write()
            self._writer = threading.Thread(target=self._write_loop, name="metrics-textfile",
                                            daemon=True)
            self._writer.start()

    def _write_loop(self) -> None:
        while not self._stop.wait(TEXTFILE_EVERY_S):
            self._write()

    def _write(self) -> None:
        try:
            write_to_textfile(str(self.textfile), self.metrics.registry)
        except OSError:  # a full disk: the next write tries again
            pass

    def close(self) -> None:
        """The last textfile (the job's end in it); the server stops."""
        self._stop.set()
        if self._writer is not None:
            self._writer.join(timeout=5)
        if self.textfile is not None and self._opened:
            self._write()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
