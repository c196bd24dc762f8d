"""Prometheus metrics of a running job: `--metrics-port`, `metrics:` of the
cluster file (launcher/views/metrics.py; served by launcher/outlets/metrics.py).

The unit tests feed typed events to `JobMetrics` and read its text with
prometheus-client's own parser; the end-to-end test scrapes a real running
`transport: local` job over HTTP and reads its textfile once it ended.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.job.record import eventlines
from launcher.job.record import events as ev
from launcher.spec.config import ConfigError, parse_config
from launcher.views.metrics import JobMetrics
from tests.conftest import PROGRESS_UNTIL_RELEASED, run_cli, start_cli, wait_for


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """{(name, sorted labels): value} of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def task(name: str, host: str, **more: str) -> tuple:
    return tuple(sorted({"job": "demo", "task": name, "host": host, **more}.items()))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _started(metrics: JobMetrics) -> None:
    metrics.tell(ev.Launch(generation=0, tasks=(ev.Placed(task="worker0", host="h0"),
                                                ev.Placed(task="worker1", host="h1"))))
    for name, host in (("worker0", "h0"), ("worker1", "h1")):
        metrics.tell(ev.TaskStarted(generation=0, task=name, host=host, pid=1))
    metrics.tell(ev.JobPhase(generation=0, phase="running"))  # as the launcher tells it


def test_job_and_task_metrics_follow_the_story():
    now = [1000.0]
    metrics = JobMetrics("demo", clock=lambda: now[0])
    _started(metrics)
    metrics.tell(ev.Progress(generation=0, task="worker0", host="h0", t=1000.0,
                             metrics={"step": 10}))
    metrics.tell(ev.Progress(generation=0, task="worker0", host="h0", t=1002.0,
                             metrics={"step": 30}))
    now[0] = 1005.0
    got = samples(metrics.text())
    assert got[("mgpu_job_state", (("job", "demo"), ("state", "running")))] == 1
    assert got[("mgpu_job_state", (("job", "demo"), ("state", "starting")))] == 0
    assert got[("mgpu_task_state", task("worker1", "h1", state="running"))] == 1
    assert got[("mgpu_task_step", task("worker0", "h0"))] == 30
    assert got[("mgpu_task_steps_per_second", task("worker0", "h0"))] == 10
    assert got[("mgpu_task_seconds_since_progress", task("worker0", "h0"))] == 3
    assert ("mgpu_task_step", task("worker1", "h1")) not in got  # no report: no sample
    assert got[("mgpu_task_seconds_since_progress", task("worker1", "h1"))] == 5  # its start
    metrics.tell(ev.FailureDetected(generation=0, task="worker1", host="h1", failure="exit"))
    metrics.tell(ev.JobPhase(generation=0, phase="failing"))
    assert samples(metrics.text())[("mgpu_job_state", (("job", "demo"), ("state", "failing")))]
    metrics.tell(ev.JobPhase(generation=0, phase="restarting"))
    metrics.tell(ev.Restart(generation=1, restarts=1))
    got = samples(metrics.text())
    assert got[("mgpu_job_state", (("job", "demo"), ("state", "restarting")))] == 1
    assert got[("mgpu_job_restarts_total", (("job", "demo"),))] == 1
    assert got[("mgpu_rollbacks_total", (("job", "demo"),))] == 0  # not a loss gone bad
    metrics.tell(ev.Launch(generation=1, tasks=(ev.Placed(task="worker0", host="h0"),)))
    metrics.tell(ev.JobDone(status="succeeded", restarts=1))
    got = samples(metrics.text())
    assert got[("mgpu_job_generation", (("job", "demo"),))] == 1
    assert got[("mgpu_job_state", (("job", "demo"), ("state", "succeeded")))] == 1


def test_goodput_parts_and_stragglers():
    metrics = JobMetrics("demo")
    _started(metrics)
    metrics.set_goodput({"training": 54.0, "startup": 6.0}, wall_s=60.0, productive_s=54.0)
    # A straggler event read back from events.jsonl (typed or not: by its kind and fields).
    metrics.tell(eventlines.from_record({"t": 1.0, "event": "straggler", "v": 2, "generation": 0,
                                 "task": "worker1", "host": "h1", "slowdown": 1.8,
                                 "evidence": {"input_s": 0.4}}))
    got = samples(metrics.text())
    assert got[("mgpu_goodput_seconds", (("job", "demo"), ("part", "training")))] == 54
    assert got[("mgpu_goodput_seconds", (("job", "demo"), ("part", "startup")))] == 6
    assert got[("mgpu_goodput_ratio", (("job", "demo"),))] == 0.9
    assert got[("mgpu_straggler_slowdown", task("worker1", "h1"))] == 1.8
    assert got[("mgpu_stragglers", (("job", "demo"),))] == 1
    assert got[("mgpu_straggler_reports_total", (("job", "demo"),))] == 1
    metrics.tell(ev.Launch(generation=1, tasks=(ev.Placed(task="worker0", host="h0"),)))
    assert samples(metrics.text())[("mgpu_stragglers", (("job", "demo"),))] == 0
    # The ledger told as an event, as summary.json holds it.
    metrics.tell(eventlines.from_record({"event": "goodput", "goodput": {
        "wall_s": 100.0, "productive_s": 80.0, "parts": {"training": 80.0, "recovery": 20.0}}}))
    got = samples(metrics.text())
    assert got[("mgpu_goodput_seconds", (("job", "demo"), ("part", "recovery")))] == 20
    assert ("mgpu_goodput_seconds", (("job", "demo"), ("part", "startup"))) not in got
    assert got[("mgpu_goodput_ratio", (("job", "demo"),))] == 0.8


def test_a_real_job_is_scraped_while_it_runs_and_its_textfile_ends_with_it(workdir: Path):
    (workdir / "job.py").write_text(PROGRESS_UNTIL_RELEASED)
    port = _free_port()
    (workdir / "cluster.yaml").write_text(
        "name: demo\ntransport: local\nhosts: [{address: 127.0.0.1}, {address: 127.0.0.1}]\n"
        f"metrics: {{port: {port}, textfile: node/mgpu.prom}}\n")
    (workdir / "node").mkdir()
    release = workdir / "release"
    proc = start_cli(["--no-live", "--run-dir", "run", "cluster.yaml", "job.py", str(release)],
                     cwd=workdir)
    try:
        def scraped() -> dict | None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    got = samples(r.read().decode())
            except OSError:
                return None
            steps = [got.get(("mgpu_task_step", task(f"worker{i}", f"host{i}"))) for i in (0, 1)]
            return got if all(s and s >= 2 for s in steps) else None

        got = wait_for(scraped, 30, "both tasks' steps in the scraped metrics")
        assert got[("mgpu_job_state", (("job", "demo"), ("state", "running")))] == 1
        assert got[("mgpu_task_state", task("worker0", "host0", state="running"))] == 1
        assert got[("mgpu_task_steps_per_second", task("worker1", "host1"))] > 0
        assert got[("mgpu_task_seconds_since_progress", task("worker1", "host1"))] < 10
        # The job's own goodput ledger, kept from its events: start-up done, training on.
        assert got[("mgpu_goodput_seconds", (("job", "demo"), ("part", "startup")))] > 0
        assert got[("mgpu_goodput_seconds", (("job", "demo"), ("part", "training")))] > 0
        assert 0 < got[("mgpu_goodput_ratio", (("job", "demo"),))] < 1
        release.touch()
        out, _ = proc.communicate(timeout=30)
    finally:
        release.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert f"metrics: http://127.0.0.1:{port}/metrics" in out
    final = samples((workdir / "node" / "mgpu.prom").read_text())
    assert final[("mgpu_job_state", (("job", "demo"), ("state", "succeeded")))] == 1
    assert final[("mgpu_task_state", task("worker1", "host1", state="succeeded"))] == 1
    assert not list((workdir / "node").glob("mgpu.prom.*"))  # no temporary file left


def test_a_busy_metrics_port_is_a_usage_error_before_anything_starts(workdir: Path):
    (workdir / "job.py").write_text("print('never')\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli(["--local", "1", "--run-dir", "run", "--metrics-port", str(port),
                          "job.py"], cwd=workdir, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"metrics port {port} on 127.0.0.1 is in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (workdir / "run").exists()


@pytest.mark.parametrize(("section", "expected"), [
    ("metrics: {port: 70000}", "c.yaml:2: metrics.port: Input should be less than or equal "
     "to 65535"),
    ("metrics: {port: '9477'}", "c.yaml:2: metrics.port: Input should be a valid integer"),
    ("metrics: {textfile: /var/lib/node/mgpu.txt}", "c.yaml:2: metrics.textfile: "
     "node_exporter's textfile collector reads only files named *.prom"),
    ("metrics: {prot: 9477}", "c.yaml:2: metrics.prot"),
    ("notify: {command: ./n.sh, events: [failed, finished]}", "c.yaml:2: notify.events[1]: "
     "Input should be 'failed', 'restarted', 'succeeded', 'stopped', 'straggler', "
     "'nonfinite' or 'loss_spike'"),
    ("notify: {command: '  '}", "c.yaml:2: notify.command: the command is empty"),
    ("notify: {events: [failed]}", "c.yaml:2: notify.command: required key is missing"),
    ("notify: {command: x, timeout_s: 0}", "c.yaml:2: notify.timeout_s: Input should be "
     "greater than 0"),
])
def test_metrics_and_notify_keys_are_checked_with_the_line(section: str, expected: str):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"hosts: [{{address: a}}]\n{section}\n", "c.yaml")
    assert expected in str(caught.value)
