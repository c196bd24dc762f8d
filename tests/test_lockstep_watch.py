"""When the supervisor calls live workers out of step (launcher/job/detect/watch.py
with job/detect/lockstep.py), driven by scripted agents on a fake clock: a healthy
job's long first step, long evaluations and a slow save on the chief alone
are never called stuck; a chief-only evaluate is named once the job has been
quiet long enough; a chief-only save that never ends names the hang."""

from __future__ import annotations

from pathlib import Path

from tests.fake_agents import harness

SUCCESS = [(5.0, "exit", {"code": 0})]


def at(t: float, **data) -> tuple[float, str, dict]:
    return (t, "progress", {"data": data})


def train(first_step_at: float, until: float, start: int = 1) -> list[tuple[float, str, dict]]:
    """Fit's start, then a step a second (the counter's reports) until `until`."""
    steps = [at(1.0, at="train", at_epoch=0, at_from=0, at_len=200, at_len_by="input",
                at_epochs=1, at_step=0)]
    t, step = first_step_at, start
    while t < until:
        steps.append(at(t, step=step, at="train", at_epoch=0, at_from=0, at_len=200))
        t, step = t + 1.0, step + 1
    return steps


def test_a_healthy_job_with_long_pauses_is_never_called_stuck(tmp_path: Path):
    def script(generation: int, name: str):
        late = 3.0 if name == "worker1" else 0.0  # reports are never in step to the second
        return [
            *train(first_step_at=5.0, until=60.0),  # a 4 s first step: 12 s of quiet needed
            # The chief saves alone for 50 s (h5 weights, no collective): worker1 waits.
            *([at(60.0, at="save", at_step=55, step=55), at(110.0, at="train", step=55)]
              if name == "worker0" else []),
            at(111.0, step=56, at="train"),
            at(112.0 + late, at="evaluate", at_step=56, step=56),  # both evaluate, 70 s
            at(182.0 + late, at="train", at_step=56, step=56),
            at(183.0, step=57, at="train"), at(184.0, at="outside", at_step=57, step=57),
            (185.0 + late, "exit", {"code": 0}),
        ]

    h = harness(tmp_path, script, hang_timeout_s=300.0)
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 0, result.failures
    assert not h.events("out_of_step_ahead")


def test_a_long_first_step_raises_the_quiet_needed(tmp_path: Path):
    def script(generation: int, name: str):
        if generation > 0:
            return SUCCESS
        if name == "worker0":  # a 30 s first step, then a chief-only evaluate
            return [*train(first_step_at=31.0, until=40.0),
                    at(40.0, at="evaluate", at_step=9, step=9)]
        return [*train(first_step_at=31.0, until=41.0)]

    h = harness(tmp_path, script, hang_timeout_s=300.0)
    cause = h.supervisor.run().failures[0]
    assert cause.kind == "out_of_step", cause
    detected = h.events("failure_detected")[0]["t"]
    started = h.events("task_started")[0]["t"]
    assert 40.0 + 3 * 30.0 <= detected - started < 40.0 + 3 * 30.0 + 2.0, detected - started


def test_evaluate_on_the_chief_only_is_named_once_the_job_is_quiet(tmp_path: Path):
    def script(generation: int, name: str):
        if generation > 0:
            return SUCCESS
        if name == "worker0":  # evaluates alone after its epoch: waits there forever
            return [*train(first_step_at=3.0, until=20.0),
                    at(20.0, at="evaluate", at_step=17, step=17)]
        return [*train(first_step_at=3.0, until=21.0)]  # goes on: waits in step 19

    h = harness(tmp_path, script, hang_timeout_s=300.0)
    result = h.supervisor.run()
    cause = result.failures[0]
    assert cause.task == "host0/worker0" and cause.kind == "out_of_step", cause
    assert cause.reason.startswith("entered evaluate() at step 17, worker1 went on training")
    detected = h.events("failure_detected")[0]["t"]
    started = h.events("task_started")[0]["t"]
    # Quiet since worker1's last step (20 s in): 10 s, far within hang_timeout_s.
    assert 30.0 <= detected - started < 32.0, detected - started
    assert h.events("stacks_requested"), "a stuck job's stacks are taken as for a hang"


def test_the_same_out_of_step_twice_stops_the_job(tmp_path: Path):
    def script(generation: int, name: str):  # every generation evaluates on the chief only
        if name == "worker0":
            return [*train(first_step_at=3.0, until=20.0),
                    at(20.0, at="evaluate", at_step=17, step=17)]
        return [*train(first_step_at=3.0, until=21.0)]

    h = harness(tmp_path, script, hang_timeout_s=300.0, max_restarts=5)
    result = h.supervisor.run()
    assert result.status == "failed" and result.restarts == 1, result
    assert result.stopped_by == "deterministic"
    assert "host0/worker0 out of step: evaluation runs on every worker" in result.message


def test_a_save_on_the_chief_only_that_never_ends_names_the_hang(tmp_path: Path):
    def script(generation: int, name: str):
        if generation > 0:
            return SUCCESS
        if name == "worker0":
            return [*train(first_step_at=3.0, until=10.0), at(10.0, at="save", at_step=7, step=7)]
        return [*train(first_step_at=3.0, until=11.0)]

    h = harness(tmp_path, script, hang_timeout_s=40.0)
    result = h.supervisor.run()
    cause = result.failures[0]
    assert cause.task == "host0/worker0" and cause.kind == "out_of_step", cause
    assert "is saving in save() at step 7" in cause.reason
    assert "call save() on every worker" in cause.reason
    assert "restart.hang_timeout_s=40" in cause.reason


def test_a_plain_hang_stays_a_hang(tmp_path: Path):
    def script(generation: int, name: str):
        if generation > 0:
            return SUCCESS
        return [*train(first_step_at=3.0, until=10.0)]  # both stop at the same step

    h = harness(tmp_path, script, hang_timeout_s=40.0)
    cause = h.supervisor.run().failures[0]
    assert cause.kind == "hang", cause


ABORT = ("E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort "
         "INVALID_ARGUMENT: Shape mismatch in the collective instance 264. Op at device "
         "/job:worker/replica:0/task:1/device:CPU:0 expected shape [] but another member in "
         "the group expected shape [81].")


def test_an_aborts_cause_is_named_from_the_reports_that_trail_it(tmp_path: Path):
    def script(generation: int, name: str):
        if generation > 0:
            return SUCCESS
        fit = at(1.0, at="train", at_epoch=0, at_from=0, at_len=100, at_epochs=1, at_step=0)
        if name == "worker1":  # its callback stopped fit after step 37; TF aborts
            return [fit, at(3.0, step=1, at="train"), (10.0, "output", {"text": ABORT}),
                    at(10.002, step=37, at="train", at_stopping=1)]  # its exit report
        return [fit, at(3.0, step=1, at="train"), at(10.003, step=38, at="train")]

    h = harness(tmp_path, script, max_restarts=0)
    result = h.supervisor.run()
    cause = result.root_cause
    assert cause is not None and cause.kind == "out_of_step", cause
    assert cause.task == "host1/worker1"
    assert cause.reason.startswith("stopped training after step 37 (a callback set "
                                   "stop_training), worker0 went on to step 38")
    # First told as TF said it, then named from the positions.
    assert h.events("failure_detected")[0]["kind"] == "collective_abort"
    assert h.events("root_cause")[-1]["kind"] == "out_of_step"
    # The teardown's SIGTERM waits a moment: it ends MWMS tasks at once, and the
    # reports that name the cause come at the peers' own exits.
    stops = [m for m in h.links["host0"].sent if m["op"] == "stop"]
    assert stops[0]["settle_s"] == 0.5 and stops[0]["grace_s"] == 0.5, stops
    assert h.events("teardown_begun")[0]["settle_s"] == 0.5
