"""The typed story of a run (launcher/job/record/events.py): every kind written as the
line events.jsonl holds and read back, documented in docs/operations.md; the
one task state machine (`states.apply`) and the generation's phases."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from launcher.job.record import eventlines
from launcher.job.record import events as ev
from launcher.job.record.phases import PHASES, IllegalPhase, Phase, move
from launcher.job.record.states import TRANSITIONS, TaskState, apply
from launcher.spec.rundir import EVENTS_SCHEMA, RunRecorder
from launcher.views import narrate

DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


@pytest.mark.parametrize("kind", sorted(ev.KINDS))
def test_every_event_kind_is_documented_with_its_fields(kind: str):
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{kind}` |")]
    assert rows, f"docs/operations.md has no row for the event `{kind}`"
    fields = rows[0].split("|")[2]
    for key in ev.keys(ev.KINDS[kind]):
        assert f"`{key}`" in fields, f"docs/operations.md: `{kind}` does not list `{key}`"


def test_every_line_carries_the_schema_version(tmp_path: Path):
    recorder = RunRecorder(tmp_path, clock=lambda: 5.0)
    ev.write(recorder, ev.HostBack(host="host1", attempts=2))
    ev.write(recorder, ev.AgentLog(host="host1", text="told, not written"))
    recorder.close()
    lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert lines == [{"t": 5.0, "event": "host_back", "v": EVENTS_SCHEMA, "host": "host1",
                      "attempts": 2}]
    assert eventlines.version(lines[0]) == 2
    assert eventlines.version({"t": 1, "event": "launch"}) == 1


def test_the_keys_of_today_s_lines_are_kept():
    """The keys version 1 wrote, same names, same order (additions after)."""
    exited = ev.fields_of(ev.TaskExited(generation=0, task="worker1", host="host1",
                                        exit_code=1, signal=None, stopped_by_launcher=False))
    assert list(exited) == ["generation", "task", "host", "exit_code", "signal",
                            "stopped_by_launcher"]
    failed = ev.fields_of(ev.FailureDetected(generation=0, task="worker1", host="host1",
                                             failure="exit", exit_code=1, reason="boom"))
    assert list(failed) == ["generation", "task", "host", "kind", "exit_code", "signal",
                            "reason"]
    progress = ev.fields_of(ev.Progress(generation=1, task="worker0", host="host0",
                                        metrics={"step": 3, "loss": 0.5, "v": 9}))
    assert progress == {"generation": 1, "task": "worker0", "host": "host0", "step": 3,
                        "loss": 0.5}
    switched = ev.fields_of(ev.KerasSwitched(generation=1, task="host0/worker0", why="x"))
    assert list(switched) == ["generation", "from", "to", "task", "why"]
    assert list(ev.fields_of(ev.Resumed(generation=2, step=30))) == ["generation", "step"]


@pytest.mark.parametrize("kind", sorted(ev.KINDS))
def test_every_kind_reads_back_as_written(kind: str):
    cls = ev.KINDS[kind]
    event = cls(**_sample(cls))
    back = eventlines.from_record(json.loads(json.dumps(ev.to_record(event, 12.5))))
    assert back == event and back.t == 12.5 and back.extra == {}


def _sample(cls: type[ev.Event]) -> dict:
    values = {"generation": 3, "task": "worker1", "host": "host1", "status": "failed"}
    import dataclasses

    return {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}


def test_unknown_kinds_and_keys_are_kept_not_refused():
    later = eventlines.from_record({"t": 1.0, "event": "teleported", "v": 7, "to": "mars"})
    assert isinstance(later, ev.Unknown) and later.name == "teleported"
    assert later.extra == {"to": "mars"}
    back = eventlines.from_record({"t": 2.0, "event": "host_back", "host": "h", "mood": "happy"})
    assert back == ev.HostBack(host="h", attempts=1) and back.extra == {"mood": "happy"}
    bare = eventlines.from_record({"event": "task_exited"})  # required keys missing: still a record
    assert isinstance(bare, ev.TaskExited) and bare.t is None


def test_the_story_is_worded_in_one_place():
    failure = ev.FailureDetected(generation=0, task="worker1", host="host1", failure="exit",
                                 exit_code=1, reason="exited with code 1")
    assert narrate.line(failure) == \
        ("notice", "failure: host1/worker1 (host host1, generation 0) exited with code 1")
    assert narrate.line(ev.TaskStarted(generation=0, task="worker0", host="host0")) is None
    assert narrate.line(ev.AgentLog(host="h", text="x")) == ("debug", "agent h: x")
    assert narrate.line(ev.Resumed(generation=2, epoch=3, step=30)) == \
        ("notice", "generation 2 resumed at epoch 3 (step 30)")


def test_a_restart_says_each_budget_by_what_it_counts():
    """`--max-restarts 1` is the budget of restarts without progress; 100 is
    restart.max_total_restarts, all of them (issue 53 item 5)."""
    budgets = {"max_restarts": 1, "max_total_restarts": 100, "backoff_s": 1.0}
    free = ev.Restart(generation=3, restarts=3, counted=False, progress=True, spent=0,
                      total=3, **budgets)
    assert narrate.line(free) == ("notice", "restarting as generation 3 in 1 s (restart 3: the "
                                  "checkpoint advanced, not counted against the 1 allowed "
                                  "without progress; at most 100 in all); workers resume from "
                                  "the last checkpoint")
    counted = ev.Restart(generation=4, restarts=4, counted=True, spent=1, total=4, **budgets)
    assert "(restart 4: 1 of the 1 allowed without progress; at most 100 in all)" \
        in narrate.line(counted)[1]
    preempted = ev.Restart(generation=5, restarts=5, counted=False, preempted=True, spent=1,
                           total=5, **budgets)
    assert "(restart 5: preempted, not counted against the 1 allowed without progress; " \
        "at most 100 in all)" in narrate.line(preempted)[1]


def test_the_replay_and_the_supervisor_share_one_state_machine():
    """Each move `apply` makes from a live state is one TRANSITIONS allows."""
    ids = {"generation": 0, "task": "worker0", "host": "host0"}
    samples = [ev.TaskStarted(**ids), ev.StartFailed(**ids), ev.TaskRestarted(**ids),
               ev.TaskUnconfirmed(**ids), ev.HostLost(generation=0, host="host0"),
               ev.TeardownBegun(generation=0, why="stop"),
               *(ev.TaskExited(**ids, exit_code=c) for c in (1, None))]
    exits = [ev.TaskExited(**ids, exit_code=c, stopped_by_launcher=s)
             for c in (0, 1, None) for s in (True, False)]
    for state in (TaskState.STARTING, TaskState.RUNNING, TaskState.STOPPING):
        # A stop is sent by a teardown only, which moved every live task to STOPPING.
        for event in samples + [e for e in exits if state is TaskState.STOPPING
                                or (not e.stopped_by_launcher and state is TaskState.RUNNING)]:
            to = apply(state, event, host="host0")
            assert to is state or to in TRANSITIONS[state], (state, event)
    stopping = TaskState.STOPPING
    done = ev.TaskExited(**ids, exit_code=0)
    assert apply(stopping, done, host="host0") is TaskState.SUCCEEDED
    assert apply(stopping, done, host="host0", lifetime="service") is TaskState.STOPPED
    assert apply(TaskState.RUNNING, ev.HostLost(generation=0, host="other"),
                 host="host0") is TaskState.RUNNING


def test_a_phase_moves_only_as_the_table_says():
    assert move(Phase.STARTING, Phase.FORMING) is Phase.FORMING
    with pytest.raises(IllegalPhase):
        move(Phase.ENDED, Phase.TRAINING)
    live = {Phase.STARTING, Phase.FORMING, Phase.TRAINING, Phase.FAILING,
            Phase.TAKING_STACKS, Phase.TEARING_DOWN, Phase.STOPPING}
    assert all(Phase.STOPPING in PHASES[p] for p in live)  # a stop is always heard
    documented = re.findall(r"\b[A-Z_]{5,}\b", move.__module__ and
                            __import__("launcher.job.record.phases", fromlist=["x"]).__doc__)
    assert {p.name for p in Phase} <= set(documented)


def test_events_are_written_only_as_typed_records():
    """No module writes an event by name (`recorder.event("kind", ...)`): every
    kind is a record of job/record/events.py, written through `events.write`."""
    repo = Path(__file__).resolve().parent.parent
    found = []
    for path in sorted((repo / "launcher").rglob("*.py")):
        rel = str(path.relative_to(repo))
        if rel == "launcher/job/record/events.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "event" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:80]}")
    assert not found, "write a typed record of launcher/job/record/events.py instead:\n" + \
        "\n".join(found)
