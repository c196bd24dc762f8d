"""The run's outlets: where the views' renderings leave the process while a
job runs (docs/design.md, "Packages in flow order").

The views (launcher/views/) are functions from the run's model to text, JSON,
HTML or metric families; this floor does the I/O around them: the threads,
the metrics' HTTP server and textfile writer, the notifications' command
processes, and the views of a launch made from the cluster file:

- `printer`: all terminal output of a run, buffered and written by a
  thread of its own so that the supervisor never waits on the terminal.
- `status_watch`: `status --watch`, polling a run directory's events.jsonl
  and redrawing the live table until the run ends.
- `launch`: the outlets of a launch (metrics, notifications) made from the
  cluster file and the command line, handed to `Launch.start(views=)`.
- `metrics`: the Prometheus text of `views.metrics.JobMetrics` served over
  HTTP (`--metrics-port`) and written for node_exporter (`metrics.textfile`).
- `notify`: the `notify:` command run for each notification of
  `views.notify`, one at a time on a thread of its own, each in its own
  process group and bounded by `timeout_s`.

May import: the views and every floor below them (job, transport, spec,
shipped). The views never import an outlet; the tools, the commands and the
cli do.
"""
