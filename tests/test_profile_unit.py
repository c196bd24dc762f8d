"""Traces in figures, and a capture's bookkeeping, without a job.

The recorded traces (tests/data/profile/) are 0.15 s of each worker of a
2-worker MultiWorkerMirroredStrategy job (tf_keras `fit`, TF 2.21 CPU),
written by `tf.profiler.experimental.start/stop` as `mgpu-launch profile` does.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.agent.profiles import REQUEST_ENV as AGENT_REQUEST_ENV
from launcher.commands.profile import table
from launcher.job.record.states import TaskState
from launcher.job.run.profiling import Profiler, trace_file
from launcher.job.run.protocol import BadMessage, check_message
from launcher.runtime.trace import REQUEST_ENV, take_request
from launcher.runtime.xplane import _covered, summarise

DATA = Path(__file__).parent / "data" / "profile"


def test_a_recorded_trace_is_summarised_into_collectives_input_and_compute():
    summary = summarise((DATA / "mwms-worker0.xplane.pb").read_bytes())
    assert summary.window_s == pytest.approx(0.1513, abs=1e-3)
    assert summary.steps == 3  # tf_keras' train_function, called 3 times in the window
    assert summary.step_s == pytest.approx(summary.window_s / 3)
    assert summary.collective_s == pytest.approx(0.0704, abs=1e-3)
    assert summary.input_s == pytest.approx(0.0014, abs=2e-4)
    # compute is what neither a collective nor the input covered
    assert summary.compute_s == pytest.approx(0.0795, abs=1e-3)
    assert summary.collective_s + summary.input_s + summary.compute_s <= summary.window_s + 1e-9


def test_the_peer_that_waits_less_in_collectives_computes_more():
    """Worker 0 waited 70 ms for worker 1 in the all-reduces, worker 1 only 48 ms."""
    w0 = summarise((DATA / "mwms-worker0.xplane.pb").read_bytes())
    w1 = summarise((DATA / "mwms-worker1.xplane.pb").read_bytes())
    assert w1.collective_s < w0.collective_s
    assert w1.compute_s > w0.compute_s


def test_counted_steps_win_over_the_step_functions_calls():
    summary = summarise((DATA / "mwms-worker1.xplane.pb").read_bytes(), steps=6)
    assert summary.steps == 6
    assert summary.step_s == pytest.approx(summary.window_s / 6)
    assert set(summary.to_json()) == {"window_s", "steps", "step_s", "collective_s",
                                      "input_s", "compute_s"}


def test_overlapping_spans_count_once_and_are_clipped_to_the_window():
    assert _covered([(0, 10), (5, 15), (20, 30)], 0, 100) == 25
    assert _covered([(-5, 5), (95, 200)], 0, 100) == 10
    assert _covered([], 0, 100) == 0


def test_the_agent_and_the_runtime_agree_on_the_request_variable():
    assert AGENT_REQUEST_ENV == REQUEST_ENV


def test_a_request_is_taken_once_and_a_bad_one_is_dropped(tmp_path: Path):
    path = tmp_path / "worker0.request"
    path.write_text(json.dumps({"id": "t1", "seconds": 1000, "start_at": 5, "logdir": "/x"}))
    request = take_request(str(path))
    assert request == {"id": "t1", "seconds": 60.0, "start_at": 5.0, "logdir": "/x"}
    assert not path.exists() and take_request(str(path)) is None
    path.write_text("[1, 2]")
    assert take_request(str(path)) is None


def test_the_drills_nan_has_its_own_file_taken_once_before_its_time(tmp_path: Path):
    import time

    from launcher.agent import profiles
    from launcher.runtime import trace

    request = profiles.request_path(str(tmp_path), "worker1")
    path = trace.nan_path(request)  # where the runtime looks: where the agent writes
    assert path == profiles.nan_path(request) and path != request
    Path(path).write_text(json.dumps({"until": time.time() + 30}))
    assert trace._take_nan(path) and not Path(path).exists()
    assert not trace._take_nan(path)  # taken once
    Path(path).write_text(json.dumps({"until": time.time() - 1}))
    assert not trace._take_nan(path) and not Path(path).exists()  # late: dropped
    Path(request).write_text("{}")
    Path(path).write_text("{}")
    profiles.clear_requests(str(tmp_path), "worker1")  # a task's start: none left
    assert not Path(request).exists() and not Path(path).exists()


def test_a_report_of_the_drills_nan_or_a_skip_is_not_a_position_only():
    from launcher.job.record.reports import ProgressReport

    at = {"at": "train", "at_step": 3}
    assert ProgressReport.read(at).position_only
    for told in ({"drill_nan": 3}, {"skip_done": [100, 2, 19]}, {"skip_not": [7, 0, 3]}):
        assert not ProgressReport.read({**at, **told}).position_only, told


def test_agent_messages_of_a_trace_are_checked():
    clean = check_message({"ev": "profile", "t": 1.0, "task": "worker0", "generation": 0,
                           "id": "20261126-183012", "error": "",
                           "summary": {"steps": 3, "step_s": float("nan"), "input_s": -1}})
    assert clean["summary"]["steps"] == 3
    assert clean["summary"]["step_s"] is None and clean["summary"]["input_s"] is None
    with pytest.raises(BadMessage, match="trace id"):
        check_message({"ev": "profile_part", "task": "worker0", "generation": 0,
                       "id": "../../etc", "offset": 0, "data": ""})


class FakeLink:
    def __init__(self, up: bool = True) -> None:
        self.sent: list[dict] = []
        self.up = up

    def send(self, message: dict) -> bool:
        self.sent.append(message)
        return self.up


def _gen(**tasks: tuple[str, TaskState]):
    records = {name: SimpleNamespace(state=state, task=SimpleNamespace(host=host))
               for name, (host, state) in tasks.items()}
    return SimpleNamespace(plan=SimpleNamespace(generation=0), records=records)


def test_a_capture_asks_each_host_once_writes_the_traces_and_names_who_did_not_answer(
        tmp_path: Path):
    now = [100.0]
    profiler = Profiler(tmp_path, clock=lambda: now[0], wall=lambda: 1.8e9)
    links = {"h0": FakeLink(), "h1": FakeLink(), "h2": FakeLink(up=False)}
    gen = _gen(worker0=("h0", TaskState.RUNNING), worker1=("h0", TaskState.RUNNING),
               worker2=("h1", TaskState.RUNNING), worker3=("h2", TaskState.RUNNING),
               worker4=("h1", TaskState.STOPPED))
    done = []
    capture = profiler.capture(gen, links, 1.0, ident="t1", on_done=done.append)
    assert [m["tasks"] for m in links["h0"].sent] == [["worker0", "worker1"]]
    assert links["h0"].sent[0]["op"] == "profile" and links["h0"].sent[0]["send_file"]
    assert capture.missing == {"worker3": "the agent of h2 is not connected",
                               "worker4": "not running (stopped)"}
    blob = b"xplane bytes"
    profiler.on_message("h0", {"ev": "profile_part", "id": "t1", "task": "worker0",
                               "offset": 0, "data": base64.b64encode(blob).decode()})
    profiler.on_message("h1", {"ev": "profile", "id": "t1", "task": "worker0",
                               "summary": {"steps": 1}, "error": ""})  # not asked of h1
    profiler.on_message("h0", {"ev": "profile", "id": "t1", "task": "worker0",
                               "summary": {"steps": 4, "step_s": 0.25}, "error": ""})
    profiler.on_message("h0", {"ev": "profile", "id": "t1", "task": "worker1",
                               "summary": None, "error": "the profiler did not start"})
    assert not done
    now[0] += 100.0  # worker2 never answers
    profiler.poll(gen, links)
    assert done == [capture] and profiler.current is None
    assert trace_file(tmp_path / "profiles" / "t1", "t1", "worker0").read_bytes() == blob
    written = json.loads((tmp_path / "profiles" / "t1" / "summary.json").read_text())
    assert written["tasks"]["worker0"]["file"] == "plugins/profile/t1/worker0.xplane.pb"
    assert written["tasks"]["worker1"]["error"] == "the profiler did not start"
    assert "no answer within" in written["missing"]["worker2"]
    lines = table(written)
    assert lines[0].split() == ["task", "host", "steps", "step", "collectives", "input",
                                "compute"]
    assert "250.0 ms" in lines[1]
    assert any(line.startswith("worker2: no trace: no answer") for line in lines)


def test_a_request_file_starts_a_capture_and_a_bad_id_never_names_a_folder(tmp_path: Path):
    profiler = Profiler(tmp_path)
    links = {"h0": FakeLink()}
    gen = _gen(worker0=("h0", TaskState.RUNNING))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "request.json").write_text('{"id": "../x", "seconds": 1}')
    profiler.poll(gen, links)
    assert not links["h0"].sent and not (tmp_path / "x").exists()
    (tmp_path / "profiles" / "request.json").write_text('{"id": "t2", "seconds": 0.5}')
    profiler.poll(gen, links)
    assert links["h0"].sent[0]["id"] == "t2" and links["h0"].sent[0]["seconds"] == 0.5
    assert not (tmp_path / "profiles" / "request.json").exists()


def test_a_task_that_dies_during_the_trace_is_named_at_once(tmp_path: Path):
    profiler = Profiler(tmp_path)
    links = {"h0": FakeLink(), "h1": FakeLink()}
    gen = _gen(worker0=("h0", TaskState.RUNNING), worker1=("h1", TaskState.RUNNING))
    done = []
    profiler.capture(gen, links, 1.0, ident="t3", on_done=done.append)
    profiler.on_message("h0", {"ev": "profile", "id": "t3", "task": "worker0",
                               "summary": {"steps": 2}, "error": ""})
    gen.records["worker1"].state = TaskState.FAILED  # e.g. the profiler crashed it
    profiler.poll(gen, links)
    assert done and done[0].missing == {
        "worker1": "it stopped running during the trace (failed)"}
