"""A job's end that a task holds back (launcher/job/detect/tailcut.py, issue 38 item 5).

A real `--local 3` job without TensorFlow: every worker reports the same five
steps; worker2 then exits 0 at once; worker0, the chief, makes its final save
(8 s of work, silent: no line, no progress report) after its peer exited;
worker1's script ends, then an exit handler holds it idle and silent, as
TensorFlow's may while its coordination service waits out a departed peer's
heartbeat. The save is not cut; the idle
task is, once the save is over and it has sat idle `finished_idle_s`: the job
succeeds long before its 60 s.
"""

from __future__ import annotations

import time
from pathlib import Path

from launcher.job.record.states import TaskState
from tests.conftest import read_events, read_summary, run_cli, start_cli

SCRIPT = """\
import hashlib, os, sys, time
from launcher import runtime

me = int(os.environ["MGPU_TASK_INDEX"])
for step in range(1, 6):
    runtime.report_progress(step, loss=1.0 / step)
    time.sleep(0.1)
if me == 2:
    sys.exit(0)
if me == 1:  # its script ends; an exit handler then holds it back, idle and silent
    import atexit
    atexit.register(time.sleep, 60)
    sys.exit(0)
# The chief's final save: work, no output, for 8 s (past restart.finished_idle_s).
digest, deadline = hashlib.sha256(), time.monotonic() + 8
with open("model.bin", "wb") as out:
    while time.monotonic() < deadline:
        digest.update(os.urandom(1 << 16))
        out.write(digest.digest())
    out.write(b"complete")
print("saved", flush=True)
"""


# Both programs end cleanly, then their interpreters' teardown hangs (as
# TensorFlow's coordination service may, waiting out a peer's heartbeat).
HELD_IN_TEARDOWN = """\
import json, time
from launcher import runtime

class Teardown:
    def __del__(self):
        time.sleep(60)

json._held = Teardown()  # finalized with the json module, after every exit handler
for step in range(1, 6):
    runtime.report_progress(step, loss=1.0 / step)
    time.sleep(0.1)
# Left open, its buffer unwritten: closed only after the hang above (module
# attributes are cleared in order), so only the flush at the program's end saves it.
json._result = open("result.txt", "w")
json._result.write("trained")
"""


def test_a_task_idle_at_the_final_step_is_cut_and_a_final_save_is_not(workdir: Path):
    (workdir / "job.py").write_text(SCRIPT)
    (workdir / "held").mkdir()
    (workdir / "held" / "job.py").write_text(HELD_IN_TEARDOWN)
    # worker1's exit handler holds it 60 s: cut past restart.exit_handlers_s, and said.
    lines = ["name: tail", "transport: local", "ports: {base: auto}", "hosts:",
             *[f"  - {{address: 127.0.0.1, name: host{i}}}" for i in range(3)],
             "restart: {exit_handlers_s: 8}"]
    (workdir / "c.yaml").write_text("\n".join(lines) + "\n")
    held = start_cli(["--no-live", "--local", "2", "--run-dir", "run", "job.py"],
                     cwd=workdir / "held")
    started = time.monotonic()
    result = run_cli(["--no-live", "--run-dir", "run", "c.yaml", "job.py"], cwd=workdir,
                     timeout=120)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert took < 45, took  # not the 60 s worker1 would have sat
    run = workdir / "run"
    events = read_events(run)
    exited = {e["task"]: e for e in events if e["event"] == "task_exited"}
    [cut] = [e for e in events if e["event"] == "tail_cut"]
    assert cut["tasks"] == ["host1/worker1"] and cut["step"] == 5 and cut["idle_s"] >= 8
    assert cut["handlers_cut"] == ["host1/worker1"] and cut["handlers_s"] == 8
    # The chief saved to the end, by itself, before anything was cut.
    assert exited["worker0"]["exit_code"] == 0 and exited["worker0"]["t"] < cut["t"]
    assert (workdir / "model.bin").read_bytes().endswith(b"complete")
    assert "saved" in (run / "logs" / "host0-worker0.log").read_text()
    assert exited["worker1"]["stopped_by_launcher"] and exited["worker1"]["t"] > cut["t"]
    summary = read_summary(run)
    assert summary["status"] == "succeeded" and summary["restarts"] == 0
    assert "warning: host1/worker1: exit handlers cut, unfinished" in result.stdout
    assert "at the final step 5" in result.stdout

    # Programs over, interpreters held in their teardown: cut OVER_S later, not 60 s.
    out, _ = held.communicate(timeout=60)
    assert held.returncode == 0, out
    run = workdir / "held" / "run"
    [cut] = [e for e in read_events(run) if e["event"] == "tail_cut"]
    assert cut["why"] == "over" and sorted(cut["tasks"]) == ["host0/worker0", "host1/worker1"]
    summary = read_summary(run)
    assert 3 <= cut["idle_s"] < 10 and summary["wall_s"] < 40
    # Their programs succeeded: the launcher only ended their teardown.
    assert {t["state"] for t in summary["tasks"].values()} == {"succeeded"}
    assert (workdir / "held" / "result.txt").read_text() == "trained"  # flushed before
    assert "program over, still exiting" in out


# The chief uploads its model from an exit handler (atexit), waiting on the
# network (idle, silent) for longer than finished_idle_s after its peer exited.
UPLOAD_AT_EXIT = """\
import atexit, os, sys, time
from pathlib import Path
from launcher import runtime

for step in range(1, 6):
    runtime.report_progress(step, loss=1.0 / step)
    time.sleep(0.1)
if os.environ["MGPU_TASK_INDEX"] != "0":
    sys.exit(0)


def upload():
    time.sleep(8)
    Path("uploaded.txt").write_text("model uploaded")


atexit.register(upload)
"""


def test_the_chiefs_exit_handler_upload_is_not_cut(workdir: Path):
    # Issue 51 item 3: its script returned, but its exit handlers are the user's.
    (workdir / "job.py").write_text(UPLOAD_AT_EXIT)
    result = run_cli(["--no-live", "--local", "2", "--run-dir", "run", "job.py"], cwd=workdir,
                     timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = read_summary(workdir / "run")
    assert summary["status"] == "succeeded", summary
    assert (workdir / "uploaded.txt").read_text() == "model uploaded"
    events = read_events(workdir / "run")
    assert not [e for e in events if e["event"] == "tail_cut" and e["why"] == "idle"], events
    [chief] = [e for e in events if e["event"] == "task_exited" and e["task"] == "worker0"]
    assert chief["exit_code"] == 0 and not chief.get("stopped_by_launcher"), chief


# ------------------------------------------------------------- the rule alone

def _generation(steps: dict[str, int | None]):
    from types import SimpleNamespace as Stub

    from launcher.job.detect.generation import Generation
    from launcher.job.record.phases import Phase
    from launcher.job.record.states import TaskRecord

    records = {}
    for name, step in steps.items():
        task = Stub(name=name, host=f"h{name[-1]}", label=f"h{name[-1]}/{name}", lifetime="job")
        record = TaskRecord(task, state=TaskState.RUNNING, last_activity=0.0,
                            returned_at=0.0, usage={"cpu": 0.5})
        if step is not None:
            record.last_progress = {"step": step}
        records[name] = record
    gen = Generation(Stub(generation=0, grace_s=3.0), records)
    gen.enter(Phase.TRAINING)
    return gen


class _Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def _cutter(clock: _Clock, handlers_s: float = 5.0):
    """finished_idle_s 5 s; tasks in their exit handlers bounded at `handlers_s`
    (by default the same 5 s, so the other rules are seen alone)."""
    from launcher.job.detect.tailcut import TailCut

    return _Cutter(TailCut(5.0, clock, handlers_s))


class _Cutter:
    """A TailCut and what the supervisor does with a cut it returns: tell it
    (`told`), tear the generation down (`stopped`: why, the grace)."""

    def __init__(self, cut) -> None:
        self.cut, self.told, self.stopped = cut, [], []

    def __iter__(self):
        return iter((self, self.told, self.stopped))

    @property
    def idle_s(self) -> float:
        return self.cut.idle_s

    @idle_s.setter
    def idle_s(self, value: float) -> None:
        self.cut.idle_s = value

    def check(self, gen) -> bool:
        from launcher.job.detect.tailcut import grace_s
        from launcher.job.record.phases import Phase

        found = self.cut.check(gen)
        if found is None:
            return False
        self.told.append(found)
        gen.enter(Phase.TEARING_DOWN)
        self.stopped.append("done")
        self.grace = grace_s(found, gen.plan)
        return True


def _watch(cut, gen, clock: _Clock, seconds: float) -> bool:
    """`check` every half second for `seconds`; whether it cut."""
    for _ in range(int(seconds * 2)):
        clock.now += 0.5
        if cut.check(gen):
            return True
    return False


def test_the_tail_rule_waits_for_idle_tasks_at_the_final_step_after_a_clean_exit():
    clock = _Clock()
    gen = _generation({"worker0": 100, "worker1": 100, "worker2": 99})
    cut, told, stopped = _cutter(clock)
    assert not _watch(cut, gen, clock, 10)  # nobody exited 0: training may go on
    gen.records["worker1"].state = TaskState.SUCCEEDED
    assert not _watch(cut, gen, clock, 10)  # worker2 is behind the final step: never cut
    gen.records["worker2"].last_progress = {"step": 100}
    gen.records["worker0"].usage = {"cpu": 85.0}  # saving
    assert not _watch(cut, gen, clock, 10)
    gen.records["worker0"].usage = {"cpu": 0.0}  # saved, then held back
    assert not _watch(cut, gen, clock, 4.5)  # idle, but not for 5 s yet
    assert _watch(cut, gen, clock, 1)
    [event] = told
    assert (event.tasks, event.peer, event.step) == (("h0/worker0", "h2/worker2"),
                                                     "h1/worker1", 100)
    assert stopped == ["done"] and gen.phase.stopping


def test_the_tail_rule_is_off_at_0_and_never_cuts_a_task_without_steps():
    clock = _Clock()
    gen = _generation({"worker0": None, "worker1": 7})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    cut, told, _ = _cutter(clock)
    assert not _watch(cut, gen, clock, 30) and not told
    gen.records["worker0"].last_progress = {"step": 7}
    cut.idle_s = 0.0
    assert not _watch(cut, gen, clock, 30) and not told


def test_a_teardown_at_work_is_let_end_and_one_held_back_is_cut():
    clock = _Clock()
    gen = _generation({"worker0": 40, "worker1": 40})
    cut, told, stopped = _cutter(clock)
    gen.records["worker1"].over_at = clock.now  # its program ended cleanly
    assert not _watch(cut, gen, clock, 10)  # worker0's program goes on: never
    gen.records["worker0"].over_at = clock.now
    gen.records["worker0"].usage = {"cpu": 60.0}  # a teardown at work (slow, under load)
    assert not _watch(cut, gen, clock, 10)
    gen.records["worker0"].usage = {"cpu": 0.0}  # then waiting (a peer's heartbeat)
    assert not _watch(cut, gen, clock, 2.5)
    assert _watch(cut, gen, clock, 1)
    [event] = told
    assert event.why == "over" and event.tasks == ("h0/worker0", "h1/worker1")
    assert stopped == ["done"]


def test_a_save_blocked_without_cpu_is_never_cut_as_idle():
    """The chief's final Model.save to a slow shared filesystem: at 0 % CPU, silent,
    past finished_idle_s, but its position says it is saving (runtime/position.py)."""
    clock = _Clock()
    gen = _generation({"worker0": 100, "worker1": 100})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    gen.positions.take("worker0", {"at": "save", "step": 100}, clock.now)
    cut, told, _ = _cutter(clock)
    assert not _watch(cut, gen, clock, 30) and not told
    gen.positions.take("worker0", {"at": "outside", "step": 100}, clock.now)  # saved
    assert _watch(cut, gen, clock, 6)
    assert told[0].tasks == ("h0/worker0",)


def test_an_evaluate_its_departed_peer_never_joined_is_not_a_tail():
    """The chief alone in evaluate() after its peer's fit ended and it exited 0:
    idle at the final step, but out of step (job/detect/lockstep.py names it), never a
    finished job's tail to cut as a success."""
    clock = _Clock()
    gen = _generation({"worker0": 40, "worker1": 40})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    gen.positions.take("worker0", {"at": "evaluate", "step": 40}, clock.now)
    cut, told, _ = _cutter(clock)
    assert not _watch(cut, gen, clock, 30) and not told


def test_a_task_idle_inside_its_script_is_never_cut():
    """Its script has not returned (a final write, a result still to print): at
    0 % CPU past finished_idle_s (a host starved of CPU looks so) it is not cut."""
    clock = _Clock()
    gen = _generation({"worker0": 100, "worker1": 100})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    gen.records["worker0"].returned_at = None
    cut, told, _ = _cutter(clock)
    assert not _watch(cut, gen, clock, 60) and not told
    gen.records["worker0"].returned_at = clock.now  # its script ended: exit handlers left
    assert not _watch(cut, gen, clock, 4.5)
    assert _watch(cut, gen, clock, 1)
    assert told[0].tasks == ("h0/worker0",) and told[0].why == "idle"


def test_exit_handlers_are_cut_only_past_their_bound_and_the_cut_names_them():
    """Issue 51 item 3: a task whose script returned is in its exit handlers (the
    chief's atexit upload, waiting on the network: idle) until the bootstrap says
    `over`. At the default bound (restart.exit_handlers_s, 60 s) it is not cut at
    finished_idle_s; past it, it is, and the cut names it; 0 never cuts it."""
    from launcher.views.narrate import _tail_cut

    clock = _Clock()
    gen = _generation({"worker0": 100, "worker1": 100})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    cut, told, _ = _cutter(clock, handlers_s=60.0)
    assert not _watch(cut, gen, clock, 59) and not told
    assert _watch(cut, gen, clock, 1.5)
    [event] = told
    assert event.tasks == event.handlers_cut == ("h0/worker0",) and event.handlers_s == 60
    line = _tail_cut(event)
    assert line.startswith("warning: h0/worker0: exit handlers cut, unfinished"), line
    assert "restart.exit_handlers_s: 60" in line and "may be incomplete" in line

    # Its exit handlers done (`over`), only the teardown left: cut within seconds.
    clock, gen = _Clock(), _generation({"worker0": 100, "worker1": 100})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    gen.records["worker0"].over_at = clock.now
    cut, told, _ = _cutter(clock, handlers_s=60.0)
    assert _watch(cut, gen, clock, 6)
    assert told[0].tasks == ("h0/worker0",) and told[0].handlers_cut is None
    assert "exit handlers" not in _tail_cut(told[0])

    clock, gen = _Clock(), _generation({"worker0": 100, "worker1": 100})
    gen.records["worker1"].state = TaskState.SUCCEEDED
    cut, told, _ = _cutter(clock, handlers_s=0.0)  # 0: exit handlers are never cut
    assert not _watch(cut, gen, clock, 300) and not told


def test_a_legacy_worker_waiting_for_a_session_with_a_finished_peer_is_cut():
    """Issue 57 item 2: a TF1 worker still waiting for its session (`joining`) after
    its chief exited 0 waits for ever; after SESSION_S the cut names who waits for
    whom, and the job is done. Not in other strategies (their joins are their own),
    nor while it waits with every peer still running."""
    from launcher.job.detect.tailcut import OVER_GRACE_S, SESSION_S
    from launcher.views.narrate import _tail_cut

    clock = _Clock()
    gen = _generation({"worker0": 400, "worker1": None})
    gen.records["worker1"].cluster = "joining"
    gen.records["worker1"].returned_at = None  # inside its script, using no CPU
    cut, told, _ = _cutter(clock)
    cut.idle_s = 0.0  # finished_idle_s: 0 keeps this cut (the wait is for ever)
    assert not _watch(cut, gen, clock, 30)  # the chief still runs: the session may form
    gen.records["worker0"].state = TaskState.SUCCEEDED
    assert not _watch(cut, gen, clock, 30) and not told  # not a legacy_server job
    gen.plan.strategy = "legacy_server"
    gen.plan.generation = 1  # a new generation: its own clock
    assert not _watch(cut, gen, clock, SESSION_S - 0.5)
    assert _watch(cut, gen, clock, 1)
    [event] = told
    assert (event.why, event.tasks, event.peer, event.step) == (
        "session", ("h1/worker1",), "h0/worker0", 400)
    assert cut.grace == OVER_GRACE_S
    assert _tail_cut(event).startswith(
        "h1/worker1: waiting for a TF1 session that needs h0/worker0, which finished "
        "(exit 0 at step 400)"), _tail_cut(event)
