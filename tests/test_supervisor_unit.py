"""The supervisor's policy, replayed with scripted agents and a fake clock.

Each history (crash, hang, lost host, slow start, crash loop, malformed
messages) runs the real `Supervisor` in milliseconds: time jumps from one
scripted message to the next. The same behaviours are proven end to end with
real processes in test_faults*.py.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest

from launcher.job.record.states import IllegalTransition, TaskRecord, TaskState
from tests.fake_agents import harness

SUCCESS = [(5.0, "exit", {"code": 0})]
ERROR = {"type": "AttributeError", "message": "'Foo' object has no attribute 'reset_states'",
         "traceback": '  File "/job/train.py", line 40, in <module>\n    main()\n'
                      '  File "/job/train.py", line 31, in train_step\n    m.reset_states()\n'}
STACK = """Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f0000000001 (most recent call first):
  File "/job/train.py", line 12 in wait_for_data
  File "/job/train.py", line 20 in <module>
"""


def crash_in(generations: set[int], task: str = "worker1", **exit_details):
    details = exit_details or {"code": 1}

    def script(generation: int, name: str):
        if name == task and generation in generations:
            return [(2.0, "output", {"text": "about to fail"}), (3.0, "exit", details)]
        return SUCCESS

    return script


def test_a_crash_restarts_the_job_which_then_succeeds(tmp_path: Path):
    h = harness(tmp_path, crash_in({0}))
    started = time.monotonic()
    result = h.supervisor.run()
    assert time.monotonic() - started < 2  # fake time: the 3 s crash takes no real time
    assert result.status == "succeeded" and result.restarts == 1
    assert result.failures[0].task == "host1/worker1" and result.failures[0].exit_code == 1
    assert [e["generation"] for e in h.events("launch")] == [0, 1]
    stops = [m for m in h.links["host0"].sent if m["op"] == "stop"]
    # The survivor is stopped at once (a crash blames no peer: nothing to wait for).
    assert stops and stops[0]["grace_s"] == 0.5 and stops[0]["settle_s"] == 0.0


def test_a_silent_task_is_a_hang_and_its_stacks_are_taken_first(tmp_path: Path):
    def script(generation: int, name: str):
        if name == "worker1" and generation == 0:
            return [(1.0, "output", {"text": "epoch 1"})]  # then nothing, forever
        if generation == 0:
            return [(1.0, "output", {"text": "epoch 1"})] + [
                (float(t), "progress", {"data": {"step": t}}) for t in range(2, 40)]
        return SUCCESS

    h = harness(tmp_path, script, hang_timeout_s=20.0)
    h.links["host1"].stacks["worker1"] = STACK
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 1
    cause = result.failures[0]
    assert cause.task == "host1/worker1" and cause.kind == "hang"
    assert cause.stack[0] == 'File "/job/train.py", line 12 in wait_for_data'
    stacks = (tmp_path / "stacks" / "worker1.txt").read_text()
    assert "wait_for_data" in stacks and "generation 0" in stacks
    # Asked for before the teardown began.
    ops = [m["op"] for m in h.links["host1"].sent]
    assert ops.index("stacks") < ops.index("stop")


def test_a_silent_host_is_lost_after_the_heartbeat_timeout(tmp_path: Path):
    h = harness(tmp_path, lambda g, t: [(30.0, "exit", {"code": 0})],
                heartbeat_timeout_s=5.0, on_host_loss="shrink")
    h.links["host1"].silent_after = h.clock.now + 2.0
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 1
    lost = h.events("host_lost")[0]
    assert lost["host"] == "host1" and "no heartbeat" in lost["detail"]
    assert lost["t"] - 1_700_001_000.0 == pytest.approx(7.0, abs=0.6)
    assert [t["host"] for t in h.events("launch")[1]["tasks"]] == ["host0"]


def test_a_task_never_started_is_named_at_the_start_timeout(tmp_path: Path):
    h = harness(tmp_path, lambda g, t: SUCCESS if g else [(100.0, "exit", {"code": 0})],
                start_timeout_s=8.0)
    h.links["host1"].ignore_start.add("worker1")
    result = h.supervisor.run()
    cause = result.failures[0]
    assert cause.kind == "start_timeout" and cause.task == "host1/worker1"
    assert "restart.start_timeout_s=8" in cause.reason and "not started" in cause.reason
    detected = h.events("failure_detected")[0]["t"] - 1_700_001_000.0
    assert 8.0 < detected < 9.0


def test_a_worker_that_never_joins_the_cluster_is_named_with_its_last_words(tmp_path: Path):
    def script(generation: int, name: str):
        if generation:
            return SUCCESS
        if name == "worker0":
            return [(1.0, "progress", {"data": {"cluster": "joining"}})]
        return [(1.0, "output", {"text": "loading the data set"})]

    h = harness(tmp_path, script, start_timeout_s=10.0)
    h.links["host1"].stacks["worker1"] = STACK
    result = h.supervisor.run()
    cause = result.failures[0]
    assert cause.kind == "start_timeout" and cause.task == "host1/worker1"
    assert "not joined the cluster" in cause.reason
    assert "'loading the data set'" in cause.reason and "host0/worker0" in cause.reason
    assert "wait_for_data" in cause.stack[0]


def test_a_crash_loop_stops_after_max_restarts_with_a_doubling_backoff(tmp_path: Path):
    h = harness(tmp_path, crash_in({0, 1, 2, 3, 4, 5}, code=3), max_restarts=2,
                backoff_s=1.0, backoff_max_s=3.0)
    result = h.supervisor.run()
    assert result.status == "failed" and result.restarts == 2
    assert result.stopped_by == "max_restarts" and "crash loop" in result.message
    assert [e["backoff_s"] for e in h.events("restart")] == [1.0, 2.0]
    assert h.events("job_done")[0]["stopped_by"] == "max_restarts"


def test_the_backoff_is_capped(tmp_path: Path):
    h = harness(tmp_path, crash_in(set(range(10)), code=3), max_restarts=5,
                backoff_s=1.0, backoff_max_s=3.0)
    h.supervisor.run()
    assert [e["backoff_s"] for e in h.events("restart")] == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_the_same_exception_at_the_same_place_twice_stops_at_once(tmp_path: Path):
    h = harness(tmp_path, crash_in({0, 1, 2}, error=ERROR, code=1), max_restarts=3)
    result = h.supervisor.run()
    assert result.status == "failed" and result.restarts == 1
    assert result.stopped_by == "deterministic"
    assert "AttributeError at /job/train.py:31 in train_step" in result.message


def test_progress_makes_restarts_free_up_to_max_total_restarts(tmp_path: Path):
    def script(generation: int, name: str):
        events = [(1.0, "progress", {"data": {"step": 10 * generation + 5, "checkpoint": 1}})]
        if name == "worker1":
            events.append((2.0, "exit", {"code": 1, "error": ERROR}))
        return events

    h = harness(tmp_path, script, max_restarts=1, max_total_restarts=4)
    result = h.supervisor.run()
    assert result.status == "failed" and result.restarts == 4
    assert result.stopped_by == "max_total_restarts"
    assert [e["counted"] for e in h.events("restart")] == [False] * 4


def test_checkpoint_files_that_move_are_progress_and_file_times_are_not(tmp_path: Path):
    states = iter([{}, {"backup/chief/checkpoint": (1,)}, {"backup/chief/checkpoint": (1,)},
                   {"backup/chief/checkpoint": (1,)}] + [{"backup/chief/checkpoint": (1,)}] * 20)
    h = harness(tmp_path, crash_in(set(range(10)), code=3), max_restarts=1,
                checkpoint_probe=lambda: next(states))
    result = h.supervisor.run()
    # Generation 0 saved a checkpoint (free), generation 1 did not (counted),
    # generation 2 neither: max_restarts=1 is spent.
    assert [e["counted"] for e in h.events("restart")] == [False, True]
    assert result.stopped_by == "max_restarts"


def test_malformed_and_hostile_messages_are_ignored_and_the_job_goes_on(tmp_path: Path):
    rng = random.Random(7)
    junk = [None, 5, "x", [], {"ev": 5}, {"ev": "exited"}, {"ev": "exited", "task": "../etc"},
            {"ev": "progress", "task": "worker1", "generation": 0, "data": {"step": "inf"}},
            {"ev": "progress", "task": "worker1", "generation": 0, "data": "nope"},
            {"ev": "started", "task": "worker0", "generation": 0, "pid": -3},
            {"ev": "exited", "task": "worker0", "generation": 0, "code": "1"},
            {"ev": "output", "task": "worker1", "generation": 0, "text": 7},
            {"ev": "heartbeat", "tasks": {"worker0": {"cpu": float("nan")}, "../x": {}}},
            {"ev": "stacks", "task": "worker0", "generation": True},
            {"ev": "started", "task": "worker9", "generation": 0, "pid": 5}]
    for _ in range(300):
        fields = {"ev": rng.choice(["exited", "progress", "output", "started", "heartbeat",
                                    "stacks", "log", "bogus"]),
                  "task": rng.choice(["worker0", "worker1", "ps/1", "", None, 3]),
                  "generation": rng.choice([0, 1, -1, "0", None, 2**70]),
                  rng.choice(["code", "signal", "pid", "data", "text", "tail"]):
                      rng.choice([None, 1, -1, 1e308, "x", [], {}, {"step": 1e400}, [1] * 99])}
        junk.append(fields)

    def script(generation: int, name: str):
        return [(0.5 + i * 0.01, "output", {"text": "fine"}) for i in range(3)] + \
            [(10.0, "exit", {"code": 0})]

    h = harness(tmp_path, script)
    for i, message in enumerate(junk):
        h.world.at(1.0 + i * 0.001, "host1", message if isinstance(message, dict)
                   else {"ev": "output", "task": "worker1", "generation": 0, "text": message})
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 0
    assert h.events("bad_message"), "malformed messages are recorded"
    json.dumps(result.to_json())  # the summary stays writable


def test_the_state_machine_refuses_illegal_moves():
    from launcher.spec.config import local_config
    from launcher.spec.plan import build_plan

    task = build_plan(local_config(1), ["x.py"], run_dir="/tmp/r", ports=[1]).tasks[0]
    record = TaskRecord(task)
    record.move(TaskState.STARTING)
    record.move(TaskState.RUNNING)
    record.move(TaskState.SUCCEEDED)
    with pytest.raises(IllegalTransition, match="succeeded -> running"):
        record.move(TaskState.RUNNING)
    assert record.state is TaskState.SUCCEEDED


def test_random_bytes_through_a_real_agent_link_never_reach_the_supervisor_as_errors(
        tmp_path: Path):
    """The agent's pipe as the launcher reads it (`AgentLink`), then the supervisor."""
    import os
    import queue as queues

    from launcher.transport import AgentLink

    rng = random.Random(11)
    lines: list[bytes] = []
    for _ in range(400):
        kind = rng.randrange(5)
        if kind == 0:
            lines.append(bytes(rng.randrange(256) for _ in range(rng.randrange(80))))
        elif kind == 1:
            lines.append(b'{"ev": "output", "task": "worker1", "generation": 0, "text": '
                         + b'"' + b"x" * rng.randrange(20000) + b'"}')
        elif kind == 2:
            lines.append(json.dumps([rng.random(), {"ev": "exited"}]).encode())
        elif kind == 3:
            lines.append(json.dumps({"ev": "progress", "task": "worker0", "generation": 0,
                                     "data": {"step": rng.choice([1, -1, 1e30, "NaN"]),
                                              "loss": float("inf")}}).encode())
        else:
            lines.append(b'{"ev": "exited", "task": "worker0", "generation": 0, "code": NaN}')
    import threading

    read_end, write_end = os.pipe()

    def feed() -> None:  # more than a pipe holds: written while the link reads
        with os.fdopen(write_end, "wb") as sink:
            sink.write(b"\n".join(lines) + b"\n")

    threading.Thread(target=feed, daemon=True).start()
    received: queues.Queue = queues.Queue()
    messages = []
    with open(os.devnull, "wb") as nowhere:
        link = AgentLink("host1", nowhere, os.fdopen(read_end, "rb"), received)
        link.start_reading()
        while True:
            message = received.get(timeout=30)
            if message.event == "agent_lost":
                break
            messages.append(message)

    h = harness(tmp_path, lambda g, t: [(5.0, "exit", {"code": 0})])
    for i, message in enumerate(messages):
        h.world.at(0.5 + i * 0.001, message.host, message.message)
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 0


def test_a_parameter_server_worker_that_dies_is_restarted_alone(tmp_path: Path):
    from launcher.spec.config import parse_config

    loaded = parse_config("""
transport: local
strategy: parameter_server
hosts:
  - {address: 127.0.0.1, name: host0, roles: {chief: 1}}
  - {address: 127.0.0.1, name: host1, roles: {worker: 1}}
  - {address: 127.0.0.1, name: host2, roles: {ps: 1}}
""")
    starts = {"worker0": 0}

    def script(generation: int, name: str):
        if name == "chief0":
            return [(10.0, "exit", {"code": 0})]
        if name == "worker0":
            starts["worker0"] += 1
            if starts["worker0"] == 1:
                return [(2.0, "exit", {"signal": 9})]
        return []  # servers run until stopped

    h = harness(tmp_path, script, loaded=loaded)
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 0, result
    assert [e["task"] for e in h.events("task_restarted")] == ["worker0"]
    assert starts["worker0"] == 2


def test_a_host_with_several_tasks_and_a_dead_link_at_start_is_lost_not_a_crash(
        tmp_path: Path):
    from launcher.spec.config import parse_config

    loaded = parse_config("""
transport: local
hosts:
  - {address: 127.0.0.1, name: host0, roles: {worker: 2}}
  - {address: 127.0.0.1, name: host1}
""")
    h = harness(tmp_path, lambda g, t: SUCCESS, loaded=loaded, on_host_loss="shrink")
    h.links["host0"].closed = True  # its connection dropped during the backoff, say
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 1, result
    assert result.failures[0].kind == "host_lost"
    assert [t["host"] for t in h.events("launch")[1]["tasks"]] == ["host1"]


def test_data_loading_before_the_strategy_is_neither_a_start_timeout_nor_a_hang(
        tmp_path: Path):
    """worker0 joins at once and waits silently; worker1 loads data for 650 s
    (printing), then joins. worker0 is silent far longer than hang_timeout_s,
    but it waits for its peers: only restart.start_timeout_s (700 s from the
    first join) could end that, and the cluster forms before."""
    def script(generation: int, name: str):
        if name == "worker0":
            return [(10.0, "progress", {"data": {"cluster": "joining"}}),
                    (652.0, "progress", {"data": {"cluster": "joined"}}),
                    (660.0, "exit", {"code": 0})]
        loading = [(float(t), "output", {"text": f"loading shard {t}"})
                   for t in range(5, 650, 60)]
        return loading + [(650.0, "progress", {"data": {"cluster": "joining"}}),
                          (652.0, "progress", {"data": {"cluster": "joined"}}),
                          (660.0, "exit", {"code": 0})]

    h = harness(tmp_path, script, hang_timeout_s=300.0, start_timeout_s=700.0)
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 0, result.failures


def test_the_cluster_start_timeout_runs_from_the_first_join(tmp_path: Path):
    def script(generation: int, name: str):
        if generation:
            return SUCCESS
        if name == "worker0":  # loads for 500 s, then joins and waits
            return [(500.0, "progress", {"data": {"cluster": "joining"}})]
        return [(float(t), "output", {"text": "still loading"}) for t in range(5, 2000, 60)]

    h = harness(tmp_path, script, start_timeout_s=600.0, hang_timeout_s=10_000.0)
    result = h.supervisor.run()
    cause = result.failures[0]
    assert cause.kind == "start_timeout" and cause.task == "host1/worker1"
    detected = h.events("failure_detected")[0]["t"] - 1_700_001_000.0
    assert 1100.0 < detected < 1102.0  # 500 s of loading + 600 s of waiting to form


def test_a_peer_lost_twice_the_same_way_is_no_deterministic_failure(tmp_path: Path):
    unavailable = {"type": "UnavailableError", "message": "Collective ops is aborted by: ...",
                   "traceback": '  File "/site-packages/tensorflow/python/eager/execute.py", '
                                'line 53, in quick_execute\n    tensors = ...\n'}
    h = harness(tmp_path, crash_in({0, 1, 2, 3}, code=1, error=unavailable), max_restarts=2)
    result = h.supervisor.run()
    assert result.stopped_by == "max_restarts" and result.restarts == 2


def test_the_live_table_is_the_runs_model_in_the_supervisors_states(tmp_path: Path,
                                                                      monkeypatch):
    """The launcher's table is the story's rows (its states folded from the
    events, `task_starting` on), the supervisor's own figures beside: at every
    redraw the states are the supervisor's; a loss that is no number is none."""
    from launcher.job.record.story import Story

    def script(generation: int, name: str):
        return [(1.0, "progress", {"data": {"step": 5, "loss": "x"}}),
                (2.0 if name == "worker0" else 3.0, "exit", {"code": 0})]

    h = harness(tmp_path, script)
    drawn, rows_of = [], Story.rows

    def rows(story, now, beside=()):
        got = rows_of(story, now, beside)
        if beside:  # the launcher's own table, on the supervisor thread
            records = h.supervisor.current.records.values()
            drawn.append(({r.task: r.state for r in got},
                          {r.task.name: r.state.value for r in records}))
            assert {r.label for r in got} == {b.label for b in beside}
        return got

    monkeypatch.setattr(Story, "rows", rows)
    assert h.supervisor.run().status == "succeeded"
    assert drawn and all(table == supervisor for table, supervisor in drawn)
    assert {"running", "succeeded"} <= {s for table, _ in drawn for s in table.values()}
    told = h.printer._story.rows(0.0)  # noqa: SLF001
    assert all(r.loss is None for r in told) and {r.step for r in told} == {5}


def test_a_burst_longer_than_a_batch_loses_no_line(tmp_path: Path):
    def script(generation: int, name: str):
        burst = [(2.0, "output", {"text": f"{name} line {n}"}) for n in range(1, 1601)]
        return [*burst, (5.0, "exit", {"code": 0})]

    h = harness(tmp_path, script)
    assert h.supervisor.run().status == "succeeded"
    h.supervisor._recorder.close()
    for name in ("worker0", "worker1"):
        log = (tmp_path / "logs" / f"host{name[-1]}-{name}.log").read_text().splitlines()
        assert log == [f"{name} line {n}" for n in range(1, 1601)]


def test_the_story_told_to_listeners_is_what_status_replays(tmp_path: Path):
    """Every event reaches a listener as it is written, with the generation's
    phase at that moment; status's replay of events.jsonl (the same state
    machine) ends with the tasks in the states the supervisor left them."""
    from launcher.job.record.phases import Phase
    from launcher.outlets.rundir import load_run

    def script(generation: int, name: str):
        if name == "worker1" and generation == 0:
            return [(1.0, "output", {"text": "epoch 1"})]  # then nothing: a hang
        return [(1.0, "progress", {"data": {"step": 1}}), *SUCCESS]

    h = harness(tmp_path, script, hang_timeout_s=20.0)
    told: list[tuple[str, Phase | None]] = []

    class Listener:
        def tell(self, event):
            told.append((event.kind, h.supervisor.phase))

    h.supervisor._story.add(Listener())  # noqa: SLF001
    result = h.supervisor.run()
    assert result.status == "succeeded" and result.restarts == 1
    h.recorder.close()
    kinds = [kind for kind, _ in told]
    assert kinds == [e["event"] for e in map(json.loads,
                                             (tmp_path / "events.jsonl").read_text().splitlines())]
    phase_of = dict(told)
    assert phase_of["failure_detected"] is Phase.FAILING
    assert phase_of["stacks_requested"] is Phase.TAKING_STACKS
    assert phase_of["teardown_begun"] is Phase.TEARING_DOWN
    assert phase_of["restart"] is Phase.BACKOFF
    assert phase_of["job_done"] is Phase.ENDED
    assert h.supervisor.phase is Phase.ENDED
    replayed = {t.label: t.state for t in load_run(tmp_path, alive=lambda _: True).tasks}
    assert replayed == {label: task["state"] for label, task in result.tasks.items()}
    assert set(replayed.values()) == {"succeeded"}
    # summary.json is the story's rendering: what the supervisor's result says, and
    # the hang's failure with its last lines and its time on the host.
    from launcher.job.record import story

    told = story.fold(story.records((tmp_path / "events.jsonl").read_text().splitlines()))
    assert told.summary() == json.loads(json.dumps(result.to_json()))
