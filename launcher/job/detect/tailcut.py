"""A job that is over but for tasks TensorFlow holds back: its end, cut short.

After the last step of a synchronous job, TensorFlow's teardown may wait out a
coordination heartbeat (`MGPU_TF_HEARTBEAT_S`, 15 s) before a task's process
exits, and the job's end waits with it (docs/benchmarks.md, "A job's tail").
The launcher ends the generation as finished (a `tail_cut` event, then the
teardown of a finished job) and the job succeeds when it knows the job is done:

- `over`: every job task has exited 0 or said that its program ended cleanly
  (`{"over": 1}`, from the bootstrap's last exit handler, files flushed:
  launcher/bootstrap.py), and those still running have sat idle in their
  interpreter's teardown for `OVER_S`. Nothing of the script is left to cut;
  they get `OVER_GRACE_S`, then SIGKILL.
- `idle`: one job task has exited 0 (a synchronous job's tasks train the same
  steps), and every other one still running has reported that same final step,
  its script's own code has returned (`{"returned": 1}`, from the bootstrap)
  and it has since sat still for `restart.finished_idle_s`: no output line, no
  progress report, under `IDLE_CPU` percent of a core at every look (its agent
  measures the task's process tree each second). They get `grace_s`. A task
  idle inside its script is never cut: on a host starved of CPU a task at work
  can look idle, and what its script does after training (a final write, a
  printed result) is the user's. Nor are its exit handlers (`atexit`: the
  chief's upload of the model, waiting on the network, is idle too): a task
  that returned but has not said `over` is cut only once it has sat still
  `restart.exit_handlers_s` (60 s; 0: never), and the cut names it
  (`handlers_cut`, said as a warning: what they did may be unfinished).

- `session` (a `legacy_server` job): one job task has exited 0 and another
  has been waiting since, for `SESSION_S`, for its TF1 session to form
  (`cluster: joining`, from `SessionManager.prepare_session`/`wait_for_session`:
  runtime/sessions.py). Its session needs every task its devices name and the
  one that exited never comes back: it would wait for ever (TF1's chief exits
  at its stop, `StopAtStepHook`'s `last_step` of the shared global step; a
  restart near the end, or a finished job launched again). The cut names who
  waited for whom; it gets `OVER_GRACE_S` (nothing of it trained yet).

A final save is work (it writes, it uses the CPU) and is not cut, nor is a task
whose position (runtime/position.py) says it is inside a save (even one blocked
on a slow filesystem, using no CPU), an evaluation or a prediction (its peer
gone, it is out of step: job/detect/lockstep.py); a teardown at
work is let end; a task that reported no step, or fewer than its peer, is never
cut. `finished_idle_s: 0` turns both off.

Pure over the generation and the clock: a cut is returned, the `TailCut`
event, and the supervisor's loop acts on it (tells it, tears the generation
down with `grace_s(cut, plan)`). Called from the supervisor thread only
(through `Watch.silence`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ...spec.plan import Plan
from ..record import events as ev
from ..record.phases import Phase
from ..record.reports import ProgressReport
from ..record.states import TaskRecord, TaskState
from .generation import Generation
from .lockstep import EVALUATE, PREDICT, SAVE

# A task using less than this much of one core is idle (a save, a data
# loader, even an evaluation uses more; a task waiting in gRPC uses ~0).
IDLE_CPU = 3.0
# A program over (every exit handler run, files flushed) whose interpreter has
# sat idle this long in its teardown is held back: a teardown at work uses the
# CPU (it took 1-6 s here under load); one waiting out a heartbeat does not.
OVER_S = 3.0
OVER_GRACE_S = 0.5  # SIGTERM, then SIGKILL: nothing of the program is left to save
# A TF1 session that did not form this long after a peer exited 0: it waits for
# that peer (a session that can form forms in well under a second on a LAN).
SESSION_S = 5.0
_LEGACY = "legacy_server"  # launcher.strategy.Strategy.LEGACY_SERVER


class TailCut:
    """Watches a generation's end; `check` is called every half second."""

    def __init__(self, idle_s: float, clock: Callable[[], float],
                 handlers_s: float = 60.0) -> None:
        self.idle_s = idle_s  # 0: never cut
        self.handlers_s = handlers_s  # a task in its exit handlers; 0: never cut
        self._clock = clock
        self._generation: int | None = None
        self._done_at: float | None = None  # when a task was first seen exited 0
        self._busy: dict[str, float] = {}  # task -> when it was last seen busy
        self._finished_at: float | None = None  # when a job task was first seen exited 0

    def check(self, gen: Generation) -> ev.TailCut | None:
        """The cut of `gen`'s tail when it is due (the supervisor acts on it), else None."""
        if gen.phase not in (Phase.FORMING, Phase.TRAINING) or gen.failure is not None:
            return None
        now = self._clock()
        if self._generation != gen.plan.generation:
            self._generation, self._done_at, self._busy = gen.plan.generation, None, {}
            self._finished_at = None
        jobs = [r for r in gen.records.values() if r.task.lifetime == "job"]
        done = [r for r in jobs if r.state is TaskState.SUCCEEDED]
        left = [r for r in jobs if r.state is TaskState.RUNNING]
        if done and self._finished_at is None:
            self._finished_at = now
        waiting = self._waiting_for_session(gen, done, left, now)
        if waiting is not None or self.idle_s <= 0:  # 0: no idle or over cut (not this one)
            return waiting
        for record in left:  # idle from the first look on, or busy now
            if _idle(record.usage):
                self._busy.setdefault(record.task.name, now)
            else:
                self._busy[record.task.name] = now
        over = self._all_over(gen, jobs, done, left, now)
        if over is not None:
            return over
        if not done or len(done) + len(left) != len(jobs):
            return None
        if self._done_at is None:
            self._done_at = now
        final = max((s for r in done if (s := _step(r)) is not None), default=None)
        if final is None or not left:
            return None
        if any(_step(r) is None or _step(r) < final or r.returned_at is None
               or _at_work(gen, r) for r in left):
            return None
        handlers = [r for r in left if r.over_at is None]  # its exit handlers not done
        if handlers and self.handlers_s <= 0:
            return None
        quiet = [now - max(self._done_at, r.returned_at or 0.0,
                           now if r.last_activity is None else r.last_activity,
                           self._busy.get(r.task.name, now)) for r in left]
        wait = [self.idle_s if r.over_at is not None else max(self.idle_s, self.handlers_s)
                for r in left]
        if any(q < w for q, w in zip(quiet, wait, strict=True)):
            return None
        cut = _cut(gen, done[0], left, final, min(quiet))
        if handlers:  # said: what they did (an upload, a write) may be unfinished
            cut = replace(cut, handlers_cut=tuple(r.task.label for r in handlers),
                          handlers_s=self.handlers_s)
        return cut

    def _all_over(self, gen: Generation, jobs: list[TaskRecord], done: list[TaskRecord],
                  left: list[TaskRecord], now: float) -> ev.TailCut | None:
        """Every job task exited 0 or said its program ended cleanly, and those
        still running have sat idle in their teardown for OVER_S: cut."""
        if not left or any(r.over_at is None for r in left) \
                or len(done) + len(left) != len(jobs):
            return None
        quiet = min(now - max(r.over_at or now, self._busy.get(r.task.name, now))
                    for r in left)
        if quiet < OVER_S:  # a teardown at work (under load it takes seconds): let it end
            return None
        steps = [s for r in jobs if (s := _step(r)) is not None]
        return _cut(gen, (done or left)[0], left, max(steps, default=0), quiet, "over")


    def _waiting_for_session(self, gen: Generation, done: list[TaskRecord],
                             left: list[TaskRecord], now: float) -> ev.TailCut | None:
        """A legacy job's task waiting for its TF1 session `SESSION_S` after a
        peer exited 0: that session can no longer form (module docstring)."""
        if getattr(gen.plan, "strategy", None) != _LEGACY or not done \
                or self._finished_at is None or now - self._finished_at < SESSION_S:
            return None
        waiting = [r for r in left if r.cluster == "joining"]
        if not waiting:
            return None
        steps = [s for r in done if (s := _step(r)) is not None]
        return _cut(gen, done[0], waiting, max(steps, default=0), now - self._finished_at,
                    "session")


def _cut(gen: Generation, peer: TaskRecord, left: list[TaskRecord], step: int,
         quiet_s: float, why: str = "idle") -> ev.TailCut:
    return ev.TailCut(generation=gen.plan.generation, tasks=tuple(r.task.label for r in left),
                      peer=peer.task.label, step=step, idle_s=round(quiet_s, 1), why=why)


def grace_s(cut: ev.TailCut, plan: Plan) -> float:
    """The teardown's grace after `cut`: a program over has nothing left to save."""
    return OVER_GRACE_S if cut.why in ("over", "session") else plan.grace_s


def _step(record: TaskRecord) -> int | None:
    return ProgressReport.read(record.last_progress).step


def _at_work(gen: Generation, record: TaskRecord) -> bool:
    """Its position (runtime/position.py) says it is inside a save, an
    evaluation or a prediction: a save blocked on a slow shared filesystem uses
    no CPU but is work, and an evaluate() its departed peer never joined is a
    job out of step (job/detect/lockstep.py names it), not a finished job's tail."""
    at = gen.positions.at.get(record.task.name)
    return at is not None and at.phase in (SAVE, EVALUATE, PREDICT)


def _idle(usage: dict[str, Any]) -> bool:
    cpu = usage.get("cpu")
    return isinstance(cpu, int | float) and cpu < IDLE_CPU
