"""ParameterServerStrategy faults on the record (issue 57 item 3), unit level:
a worker restarted alone is a failure in the story, and so in `status`,
summary.json, the report, the metrics and the notifications; a restore whose
step cannot be read is said as an unknown resume point; the gRPC errors while
the worker restarts fold to one line. The real jobs: tests/test_ps_faults.py.
"""

from __future__ import annotations

from launcher.job.detect.resumes import Resumes
from launcher.job.lines.grpcfold import GrpcFolder, Restarting
from launcher.job.record import events as ev
from launcher.job.record import story
from launcher.views import narrate
from launcher.views.metrics import JobMetrics
from launcher.views.notify import notification

KILLED = "killed (SIGKILL: by a user)"


def _ps_story(*, then_fail: bool) -> story.Story:
    told = story.Story()
    told.tell(ev.Launch(generation=0, t=1.0, tasks=tuple(
        ev.Placed(task=name, host=host, lifetime="job" if name == "chief0" else "service")
        for name, host in (("chief0", "h0"), ("ps0", "h0"), ("worker0", "h1"),
                           ("worker1", "h1")))))
    for name, host in (("chief0", "h0"), ("ps0", "h0"), ("worker0", "h1"), ("worker1", "h1")):
        told.tell(ev.TaskStarting(generation=0, task=name, host=host, t=1.0))
        told.tell(ev.TaskStarted(generation=0, task=name, host=host, pid=1, t=2.0))
    told.tell(ev.TaskExited(generation=0, task="worker1", host="h1", signal=9, t=5.0))
    told.tell(ev.TaskRestarted(generation=0, task="worker1", host="h1", signal=9,
                               failure="signal", reason=KILLED, at=4.9, t=5.0,
                               last_lines=("serving",)))
    if then_fail:
        told.tell(ev.FailureDetected(generation=0, task="ps0", host="h0", failure="signal",
                                     signal=9, reason=KILLED, at=8.0, t=8.0))
        told.tell(ev.JobDone(status="failed", t=9.0))
    else:
        told.tell(ev.JobDone(status="succeeded", t=9.0))
    return told


def test_a_worker_restarted_alone_is_a_failure_on_the_record_but_never_the_root_cause():
    survived = _ps_story(then_fail=False)
    [alone] = survived.summary()["failures"]
    assert alone["restarted_alone"] is True and alone["task"] == "h1/worker1"
    assert alone["kind"] == "signal" and alone["t"] == 4.9 and alone["last_lines"] == ["serving"]
    assert "restarted alone" in alone["description"]
    assert survived.summary()["root_cause"] is None
    assert survived.tasks["worker1"].restarted_alone == 1
    assert story.restarts_words(0, survived.failure_list()) == "1 worker restarted alone"
    assert story.restarts_words(2, [alone, alone]) == "2 restarts; 1 worker restarted alone 2 times"
    assert story.restarts_words(0, []) == "no restarts"
    failed = _ps_story(then_fail=True)
    assert [f["task"] for f in failed.failure_list()] == ["h1/worker1", "h0/ps0"]
    assert failed.root_cause()["task"] == "h0/ps0"  # the worker restarted alone is none
    said = narrate.line(ev.TaskRestarted(generation=0, task="worker1", host="h1",
                                         reason=KILLED))
    assert said is not None and said[1].startswith("failure: h1/worker1 (host h1, generation 0)")


def test_ps_servers_serve_on_the_timeline_not_start():
    told = _ps_story(then_fail=False)
    spans = told.timeline.spans(10.0)
    ps = [s.activity for s in spans if s.task == "ps0"]
    assert ps == ["starting", "serving"], spans
    worker1 = [s.activity for s in spans if s.task == "worker1"]
    assert worker1 == ["starting", "serving", "failed", "starting"], spans
    assert [s.activity for s in spans if s.task == "chief0"] == ["starting"]  # no step yet


def test_metrics_and_notifications_count_a_worker_restarted_alone():
    metrics = JobMetrics("demo", clock=lambda: 10.0)
    for event in (ev.Launch(generation=0, tasks=(ev.Placed(task="worker1", host="h1"),)),
                  ev.TaskRestarted(generation=0, task="worker1", host="h1", reason=KILLED),
                  ev.TaskRestarted(generation=0, task="worker1", host="h1", reason=KILLED)):
        metrics.tell(event)
    assert 'mgpu_task_restarts_alone_total{host="h1",job="demo",task="worker1"} 2.0' \
        in metrics.text()
    assert notification(ev.TaskRestarted(generation=0, task="worker1", host="h1")) == "restarted"


def test_a_restore_whose_step_cannot_be_read_is_an_unknown_resume_point():
    resumes = Resumes()
    resumes.starting(0, None)
    resumes.told(0, "chief0", {"step": 10})
    resumes.starting(1, None)
    told = resumes.told(1, "chief0", {"resumed_unknown": "the checkpoint holds no optimizer"})
    [resumed] = [e for e in told if isinstance(e, ev.Resumed)]
    assert resumed.step is None and resumed.unknown == "the checkpoint holds no optimizer"
    assert not resumes.told(1, "chief0", {"step": 11})  # a later step is no resume point
    assert resumes.entries == [{"generation": 1,
                                "unknown": "the checkpoint holds no optimizer"}]
    said = narrate.line(resumed)
    assert said is not None and "at a step that cannot be told" in said[1], said
    assert "from the beginning" not in said[1]


def _worker1() -> Restarting:
    return Restarting("h1/worker1", 1, "127.0.0.1", 51777)


BLOCK = (
    "E0000 00:00:1.5 17737 context.cc:873] Failed to register function remotely due to "
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:51777: "
    "Failed to connect to remote host: Connection refused",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 "
    "while calling /tensorflow.eager.EagerService/Enqueue:",
    ':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to '
    'all addresses; last error: UNKNOWN: ipv4:127.0.0.1:51777: Connection refused"}',
    "This could happen if the remote target has been disconnected from the client.",
)


def test_grpc_errors_about_a_restarting_worker_fold_to_one_line_until_it_serves():
    folder = GrpcFolder()
    assert folder.show("h0/chief0", BLOCK[0]) == [BLOCK[0]]  # before the restart: shown
    folder.restarting("worker1", _worker1())
    for _ in range(3):
        for line in BLOCK:
            assert folder.show("h0/chief0", line) == []
    assert folder.show("h0/chief0", "10/10 - 1s - loss: 0.4") == ["10/10 - 1s - loss: 0.4"]
    # the same sentence after a line shown is no continuation; another worker is not held
    assert folder.show("h0/chief0", BLOCK[3]) == [BLOCK[3]]
    other = BLOCK[1].replace("task:1", "task:10")
    assert folder.show("h0/chief0", other) == [other]
    assert folder.show("h1/worker1", "mgpu-launch: worker1 serving at 127.0.0.1:51777") == [
        "mgpu-launch: worker1 serving at 127.0.0.1:51777"]  # its own lines are shown
    owed = folder.back("worker1", "mgpu-launch: worker1 serving at 127.0.0.1:51777",
                       lambda label: f"logs/{label.replace('/', '-')}.log")
    assert owed == [("h0/chief0", "… 12 lines of gRPC errors while h1/worker1 restarted "
                     "alone (it could not be reached), in logs/h0-chief0.log")]
    assert folder.show("h0/chief0", BLOCK[0]) == [BLOCK[0]]  # it serves again: shown
    assert folder.flush("h0/chief0", "log") == []


def test_a_task_that_exits_while_the_worker_restarts_says_its_fold_line():
    folder = GrpcFolder()
    folder.restarting("worker1", _worker1())
    assert folder.show("h0/chief0", BLOCK[0]) == []
    assert folder.flush("h0/chief0", "logs/h0-chief0.log") == [
        "… 1 line of gRPC errors while h1/worker1 restarted alone (it could not be "
        "reached), in logs/h0-chief0.log"]
    verbose = GrpcFolder(enabled=False)
    verbose.restarting("worker1", _worker1())
    assert verbose.show("h0/chief0", BLOCK[0]) == [BLOCK[0]]
