"""A drill's faults: listen to a running job's story, inject one fault after another.

`Story` is a `Listener` of the job's typed events (launcher/job/events.py):
it keeps each generation's steps, checkpoints, exits, failures and resume
point. `Injector` runs beside the supervisor, in its own thread: once the
job has saved a checkpoint it injects each fault through the agents, which
know the tasks' process groups (the `signal` op; for a whole host an
`exec_check` that freezes the agent, then kills the tasks and the agent),
and waits for the failure to be detected and for the next generation's
first step. What it saw is an `Observed` per fault (`drill_report` judges).

Steps are absolute: `runtime.callbacks()` counts a generation's steps from 0
and reports the restored step count (`start_step`) once, at its first epoch;
that offset is added to the generation's later reports.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..job import checkpoints
from ..job import events as ev
from ..job import story as model
from ..job.launch import Job
from ..views.drill_report import Observed, Point

POLL_S = 0.1
DISK_EVERY_S = 1.0  # a look at the checkpoint directory walks it (a shared filesystem)
DETECT_WAIT_S = 120.0  # a hang is detected in 7-8 s; a lost host's heartbeat in 10 s
RECOVER_WAIT_S = 600.0  # start, form the cluster, restore, trace the first step
# Freeze the agent first (it reports nothing more), kill the tasks' process
# groups, then the agent: a host that dies at once, as far as the job can tell.
_HOST_DOWN = ("import os, signal, sys\n"
              "agent, groups = int(sys.argv[1]), [int(g) for g in sys.argv[2:]]\n"
              "os.kill(agent, signal.SIGSTOP)\n"
              "for g in groups:\n"
              "    try:\n        os.killpg(g, signal.SIGKILL)\n"
              "    except OSError:\n        pass\n"
              "os.kill(agent, signal.SIGKILL)\n")


_HOW = {"kill": "SIGKILL", "preempt": "SIGTERM, then the grace", "hang": "SIGSTOP",
        "host": "its agent and tasks killed"}


class Story:
    """What the drill needs of the job's events (told from the supervisor thread):
    a view of the job (`Launch.start(views=)`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.cond = threading.Condition()
        self.clock = clock
        # The run's model (launcher/job/story.py): the generation, each one's
        # failure, the job's end and the resumes behind the last save.
        self.model = model.Story()
        self.tasks: dict[int, list[tuple[str, str, int | None]]] = {}  # gen: (task, host, pid)
        self.points: dict[tuple[int, str], list[Point]] = {}
        self.offset: dict[int, int] = {}
        self.resumed: dict[int, int] = {}
        self.first_step_t: dict[int, float] = {}
        self.counted_first: dict[int, tuple[float, int]] = {}
        self.counted_moved: dict[int, float] = {}
        self.exits: dict[tuple[int, str], tuple[float, int | None, int | None]] = {}
        # (t, step, generation, told by the saver: chief, else worker0)
        self.checkpoints: list[tuple[float, int, int, bool]] = []
        self.saver_reports = False
        self.disk_saves: list[tuple[float, int, int]] = []  # the same, seen on disk
        self.reported_checkpoints = False
        self.save_seconds: list[float] = []  # each save's time, as the bootstrap timed it
        self.finished: set[tuple[int, str]] = set()  # tasks that exited 0 by themselves

    @property
    def generation(self) -> int:
        return self.model.generation

    @property
    def ended(self) -> ev.JobDone | None:
        return self.model.ended

    def detected(self, gen: int) -> float | None:
        """When generation `gen`'s failure was told."""
        failure = self.model.failures.get(gen)
        return None if failure is None else failure.t

    def finished_in(self, gen: int, but: str) -> bool:
        """Did a task of `gen` other than `but` (the victim) finish training?"""
        return any(g == gen and task != but for g, task in self.finished)

    def open(self, record: Callable[[ev.Event], None]) -> None:
        """A view of the job (launch.View): it adds no events of its own."""

    def close(self) -> None:
        pass

    def tell(self, event: ev.Event) -> None:
        with self.cond:
            self._take(event, self.clock())
            self.cond.notify_all()

    def _take(self, event: ev.Event, t: float) -> None:
        self.model.tell(event, t)
        if isinstance(event, ev.Launch):
            self.tasks[event.generation] = [(p.task, p.host, None) for p in event.tasks
                                            if p.lifetime == "job"]
        elif isinstance(event, ev.TaskStarted):
            self.tasks[event.generation] = [
                (n, h, event.pid if n == event.task else pid)
                for n, h, pid in self.tasks.get(event.generation, [])]
        elif isinstance(event, ev.Progress):
            self._progress(event, t)
        elif isinstance(event, ev.TaskExited):
            self.exits[(event.generation, event.task)] = (t, event.exit_code, event.signal)
            if event.exit_code == 0 and not event.stopped_by_launcher:
                self.finished.add((event.generation, event.task))

    def _progress(self, event: ev.Progress, t: float) -> None:
        m, gen = event.metrics, event.generation
        if isinstance(m.get("save_s"), int | float):
            self.save_seconds.append(float(m["save_s"]))
        if isinstance(m.get("saved"), int) and not isinstance(m.get("saved"), bool):
            # A completed save the bootstrap saw, wherever the script keeps it
            # (runtime/saves.py): its step is the optimizer's count.
            self._checkpoint(event.task, int(m["saved"]), gen, t, bool(m.get("chief")))
        if isinstance(m.get("resumed"), int) and gen > 0:  # read at the restore
            self.resumed.setdefault(gen, int(m["resumed"]))
        step = m.get("step")
        if not isinstance(step, int | float):
            return
        if m.get("start_epoch"):  # runtime.callbacks() after a restore, before a step
            self.offset[gen] = int(m.get("start_step") or 0)
            self.resumed.setdefault(gen, self.offset[gen])
            return
        if m.get("counted"):  # read off the optimizer every 2 s (runtime/steps.py)
            self._counted(gen, event.task, int(step), t, "saved" in m)
            return
        absolute = int(step) + self.offset.get(gen, 0)
        if gen > 0 and gen not in self.resumed:  # the first step done after the restore
            self.resumed[gen] = max(0, absolute - 1)
        self.first_step_t.setdefault(gen, t)
        saved = bool(m.get("checkpoint"))
        if saved and "saved" not in m:  # the script's own word (runtime.callbacks())
            self._checkpoint(event.task, absolute, gen, t, False)
        self.points.setdefault((gen, event.task), []).append((t, absolute, saved))

    def _checkpoint(self, task: str, step: int, gen: int, t: float, chief: bool) -> None:
        """A save reported: the saver's word first (the chief; a peer may run
        ahead of its save)."""
        self.reported_checkpoints = True
        saver = chief or task in ("chief", "worker0")
        if saver or not self.saver_reports:
            if saver and not self.saver_reports:
                self.saver_reports = True
                self.checkpoints = [c for c in self.checkpoints if c[3]]
            if (step, gen) not in {(c[1], c[2]) for c in self.checkpoints[-4:]}:
                self.checkpoints.append((t, step, gen, self.saver_reports))

    def _counted(self, gen: int, task: str, step: int, t: float, saved: bool) -> None:
        """A script that reports no steps: the optimizer's restored count (read
        at the restore, else first read) is where it resumed; the count moving
        past it is its first step."""
        first = self.counted_first.setdefault(gen, (t, self.resumed.get(gen, step)))
        if step > first[1]:
            self.counted_moved.setdefault(gen, t)
        self.points.setdefault((gen, task), []).append((t, step, saved))

    def first_step(self, gen: int) -> float | None:
        """When generation `gen` trained its first step (the script's word first)."""
        return self.first_step_t.get(gen) or self.counted_moved.get(gen)

    def resumed_at(self, gen: int) -> int | None:
        if gen in self.resumed:
            return self.resumed[gen]
        return self.counted_first[gen][1] if gen in self.counted_first else None

    def recovery(self, observed: Observed, gen: int) -> None:
        """What the generation after `gen`'s fault says: when it was detected,
        when the next trained, where it resumed (and a task behind the last save)."""
        observed.detected_t = self.detected(gen)
        observed.recovered_t = self.first_step(gen + 1)
        observed.resumed_from_step = self.resumed_at(gen + 1)
        observed.behind = self.behind_said(gen + 1)

    def behind_said(self, gen: int) -> str:
        """A task of `gen` that resumed behind the last save, in words ("": none)."""
        behind = next((b for b in self.model.resume_behind if b.generation == gen), None)
        if behind is None:
            return ""
        return (f"{behind.task} resumed at step {behind.step}, behind the last save (step "
                f"{behind.saved_step} in {behind.directory or 'its directory'})")

    def on_disk_change(self) -> None:
        """The checkpoint directory's series moved: a save (its step: the
        furthest reported by then), counted if the script reports none."""
        with self.cond:
            step = self.furthest(self.generation)
            if step is not None:
                self.disk_saves.append((self.clock(), step, self.generation))
                self.cond.notify_all()

    def saves(self) -> list[tuple[float, int, int]]:
        """The saves the script reported; if it reports none, those seen on disk."""
        if self.reported_checkpoints:
            return [c[:3] for c in self.checkpoints]
        return self.disk_saves

    # ------------------------------------------------------------- reading
    def furthest(self, gen: int) -> int | None:
        steps = [p[1] for (g, _), pts in self.points.items() if g == gen for p in pts]
        return max(steps) if steps else None

    def saves_in(self, gen: int) -> int:
        return sum(1 for _, _, g in self.saves() if g == gen)

    def last_checkpoint(self, upto: int | None = None) -> int | None:
        """The step of the last save (of generations up to `upto`)."""
        saves = [c for c in self.saves() if upto is None or c[2] <= upto]
        return saves[-1][1] if saves else None

    def trained_since(self, gen: int, task: str, t: float) -> bool:
        """Did `task` report a step after `t`?"""
        return any(p[0] > t for p in self.points.get((gen, task), []))

    def series(self, until: dict[int, float]) -> list[list[Point]]:
        """One task's reports per generation, up to its fault: the saver's
        (it reports the saves), else the one with most."""
        best: dict[int, list[Point]] = {}

        def rank(points: list[Point]) -> tuple[bool, int]:
            return any(p[2] for p in points), len(points)

        for (gen, _), pts in self.points.items():
            kept = [p for p in pts if p[0] < until.get(gen, float("inf"))]
            if rank(kept) > rank(best.get(gen, [])):
                best[gen] = kept
        return [best[g] for g in sorted(best)]


class Injector:
    """Injects `faults` into a started job, one after another, each once the
    job trains again after the last (run in a thread beside `job.run()`)."""

    def __init__(self, job: Job, story: Story, faults: list[str], *, grace_s: float,
                 checkpoint_wait_s: float, checkpoint_dir: str,
                 say: Callable[[str], None] = lambda _text: None) -> None:
        self.job, self.story, self.faults = job, story, faults
        self.say = say
        self.grace_s = grace_s
        self.checkpoint_wait_s = checkpoint_wait_s
        self.checkpoint_dir = checkpoint_dir
        self.observed: list[Observed] = []
        self.fault_t: dict[int, float] = {}  # generation -> when its fault came
        self._disk = checkpoints.checkpoint_state(checkpoint_dir)
        self._next_look = 0.0
        self.injected = 0

    def run(self) -> None:
        try:
            for index, fault in enumerate(self.faults):
                self.observed.append(self._one(fault, first=index == 0))
        except Exception as exc:  # noqa: BLE001 - the drill's own fault: end the job, say it
            self.say(f"drill: stopped by its own error: {type(exc).__name__}: {exc}")
        finally:
            if self.story.ended is None:  # the drill is over: end the job
                self.say("drill: every fault injected; stopping the job")
                self.job.request_stop(signal.SIGTERM)

    # -------------------------------------------------------------- waiting
    def _wait(self, ready: Callable[[], Any], timeout: float) -> Any:
        """Wait until `ready()` (under the story's lock) or the job ended."""
        deadline = time.monotonic() + timeout
        story = self.story
        while True:
            with story.cond:
                value = ready()
                if value or story.ended is not None or time.monotonic() >= deadline:
                    return value
                story.cond.wait(POLL_S)
            self._look_at_disk()

    def _look_at_disk(self) -> None:
        if time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + DISK_EVERY_S
        now = checkpoints.checkpoint_state(self.checkpoint_dir)
        if checkpoints.advanced(self._disk, now):
            self.story.on_disk_change()
        self._disk = now

    def _settle(self, first: bool) -> int:
        """Wait for the current generation to train and save: each fault comes
        right after the first save it sees (the bootstrap times each save, and
        the interval is read from the saves' steps: drill_report.report)."""
        story = self.story
        self._wait(lambda: story.first_step(story.generation), RECOVER_WAIT_S)
        gen = story.generation
        self._wait(lambda: story.saves_in(gen) >= 1, self.checkpoint_wait_s)
        return story.generation

    # ------------------------------------------------------------ one fault
    def _one(self, fault: str, first: bool) -> Observed:
        story = self.story
        gen = self._settle(first)
        observed = Observed(fault, generation=gen, grace_s=self.grace_s)
        with story.cond:
            victims = [v for v in story.tasks.get(gen, []) if v[2] is not None]
            if story.ended is not None:
                ended = story.ended
                observed.again = ended.status == "succeeded"
                observed.not_injected = (
                    f"the job finished before the {fault}: give it more steps to train"
                    if ended.status == "succeeded" else
                    f"the job {ended.status} before the {fault}: {ended.message or 'see its logs'}")
                return observed
            if not victims:
                observed.not_injected = f"no task was running to inject the {fault} into"
                return observed
            task, host, pid = victims[-1]  # the last worker: not the one that saves
            observed.victim = host if fault == "host" else f"{host}/{task}"
            observed.step_at_fault = story.furthest(gen)
            observed.last_checkpoint_step = story.last_checkpoint()
            observed.steps_per_s = _rate(story.series({}))
        if not self._inject(fault, task, host, victims):
            observed.not_injected = f"{host}'s agent could not be reached to inject the {fault}"
            return observed
        observed.t0 = t0 = time.time()
        self.fault_t[gen] = t0
        self.injected += 1
        self.say(f"drill: {fault} ({_HOW[fault]}) of {observed.victim} at step "
                 f"{observed.step_at_fault} (last checkpoint: step "
                 f"{observed.last_checkpoint_step})")
        if fault == "preempt":
            self._preempt(observed, task, host, t0)
        self._wait(lambda: story.detected(gen), DETECT_WAIT_S)
        self._wait(lambda: story.first_step(gen + 1), RECOVER_WAIT_S)
        with story.cond:
            story.recovery(observed, gen)
            if observed.recovered_t is None and story.ended is not None:
                observed.ended = (f"the job {story.ended.status}"
                                  + (f": {story.ended.message}" if story.ended.message else ""))
            # What the faulted generation did until its teardown counts: its
            # peers may train and save on while a hang is being detected.
            observed.last_checkpoint_step = story.last_checkpoint(upto=gen)
            furthest = story.furthest(gen)
            if furthest is not None:
                observed.step_at_fault = max(observed.step_at_fault or 0, furthest)
            done = observed.recovered_t is None and story.ended is not None \
                and story.ended.status == "succeeded"
            if done or story.finished_in(gen, but=task):  # the training ended, not the fault
                observed.t0, observed.again = None, True  # again, in a job of its own
                observed.not_injected = (f"the job finished its training during the {fault}, "
                                         "with nothing left to resume: give it more steps")
                self.say(f"drill: {observed.not_injected}")
                return observed
        if observed.recovered_t is not None:
            self.say(f"drill: {fault}: training again {observed.recovered_t - t0:.1f} s after "
                     f"it, from step {observed.resumed_from_step}")
        return observed

    def _send(self, host: str, message: dict[str, Any]) -> bool:
        link = self.job.supervisor.links.get(host)
        return link is not None and link.send(message)

    def _signal(self, host: str, task: str, signum: int) -> bool:
        return self._send(host, {"op": "signal", "task": task, "signum": int(signum)})

    def _inject(self, fault: str, task: str, host: str,
                victims: list[tuple[str, str, int | None]]) -> bool:
        if fault == "kill":
            return self._signal(host, task, signal.SIGKILL)
        if fault == "preempt":
            return self._signal(host, task, signal.SIGTERM)
        if fault == "hang":
            return self._signal(host, task, signal.SIGSTOP)
        link = self.job.supervisor.links.get(host)
        hello = (link.hello if link is not None else None) or {}
        if not hello.get("pid") or not hello.get("python"):
            return False
        groups = [str(pid) for _, h, pid in victims if h == host and pid]
        return self._send(host, {"op": "exec_check", "id": "drill-host-loss",
                                 "argv": [hello["python"], "-S", "-c", _HOST_DOWN,
                                          str(hello["pid"]), *groups],
                                 "timeout_s": 10})

    def _preempt(self, observed: Observed, task: str, host: str, t0: float) -> None:
        """A preemption: SIGTERM, then the grace. A task still there when it ends
        is killed as the machine would be, unless it stopped training (a save
        under way): then its save is timed, up to a bound, to say how long it took."""
        story, gen = self.story, observed.generation

        def exited() -> Any:
            return story.exits.get((gen, task)) or story.detected(gen)

        self._wait(exited, self.grace_s)
        with story.cond:
            gone = exited()
            training = story.trained_since(gen, task, t0 + 0.5)
        if not gone and not training:
            self._wait(exited, max(30.0, 2 * self.grace_s))
            with story.cond:
                gone = exited()
            if not gone:
                observed.still_saving_s = time.time() - t0
        if not gone:
            self._signal(host, task, signal.SIGKILL)
        with story.cond:
            exit_ = story.exits.get((gen, task))
        if exit_ is None:  # its exit may follow the peers' failure: wait a little
            self._wait(lambda: story.exits.get((gen, task)), self.grace_s + 5.0)
            exit_ = story.exits.get((gen, task))
        if exit_ is not None and exit_[1] == 42:
            observed.term_saved, observed.term_exit_t = True, exit_[0]


def _rate(series: list[list[Point]]) -> float | None:
    from ..views.drill_report import cost_and_rate

    return cost_and_rate(series)[1]
