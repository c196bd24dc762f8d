"""A drill's faults: listen to a running job's story, inject one fault after another.

`Heard` is a `Listener` of the job's typed events (launcher/job/record/events.py):
it folds them into the run's model (launcher/job/record/story.py, whose `history`
keeps each generation's steps, saves, exits and resume point) and wakes the
injector. `Injector` runs beside the supervisor, in its own thread: once the
job has saved a checkpoint it injects each fault through the agents, which
know the tasks' process groups (the `signal` op; for a whole host an
`exec_check` that freezes the agent, then kills the tasks and the agent),
and waits for the failure to be detected and for the next generation's
first step. What it saw is an `Observed` per fault (`drill_report` judges).

Steps are absolute (launcher/job/record/history.py).
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from ..job.detect import checkpoints
from ..job.detect.lockstep import Position
from ..job.detect.lockstep import read as read_position
from ..job.record import events as ev
from ..job.record import story as model
from ..job.record.history import Exit, History
from ..job.record.reports import ProgressReport
from ..job.run.launch import Job
from ..views.drill_report import Observed, Point

POLL_S = 0.1
DISK_EVERY_S = 1.0  # a look at the checkpoint directory walks it (a shared filesystem)
DETECT_WAIT_S = 120.0  # a hang is detected in 7-8 s; a lost host's heartbeat in 10 s
NAN_STEPS = 20  # steps trained after the drill's NaN went in with no loss gone bad: unseen
NAN_TAKEN_S = 10.0  # a task takes the NaN at its next step (its request looked for every 0.2 s)
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
        "host": "its agent and tasks killed", "nan": "one weight made NaN at its next step"}


class Heard:
    """What the drill hears of the job: the run's model (launcher/job/record/story.py),
    told each event from the supervisor thread under the condition the
    injector waits on, and the saves seen on disk (for a script that reports
    none). A view of the job (`Launch.start(views=)`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.cond = threading.Condition()
        self.clock = clock
        self.model = model.Story(history=History(keep_reports=True))  # each report kept
        self.disk_saves: list[tuple[float, int, int]] = []  # (t, step, generation)
        self.positions: dict[int, Position] = {}  # generation: where its workers are
        # What made the script's last save (runtime/saves.py): keras3, tf_keras,
        # tensorflow...; and whether it was runtime.callbacks()' own.
        self.saver: tuple[str, bool] = ("", False)
        self.nan_at: dict[int, int] = {}  # generation: the step the drill's NaN went in at

    @property
    def generation(self) -> int:
        return self.model.generation

    @property
    def ended(self) -> ev.JobDone | None:
        return self.model.ended

    @property
    def history(self) -> History:
        return self.model.history

    def open(self, record: Callable[[ev.Event], None]) -> None:
        """A view of the job (launch.View): it adds no events of its own."""

    def close(self) -> None:
        pass

    def tell(self, event: ev.Event) -> None:
        with self.cond:
            self.model.tell(event, self.clock())
            if isinstance(event, ev.Progress) and event.metrics.get("saved_with"):
                self.saver = (str(event.metrics["saved_with"]),
                              bool(event.metrics.get("saved_by_runtime")))
            if isinstance(event, ev.Progress):
                gen = event.generation
                self.positions[gen] = read_position(event.metrics,
                                                    self.positions.get(gen, Position()))
                nan_at = ProgressReport.read(event.metrics).drill_nan
                if nan_at is not None:
                    self.nan_at.setdefault(gen, nan_at)
            self.cond.notify_all()

    def in_last_epoch(self, gen: int) -> bool:
        """Generation `gen`'s `fit` is in its last epoch (as far as known): no
        save at an epoch's end will come before its training ends."""
        at = self.positions.get(gen)
        return at is not None and at.epochs > 0 and at.epoch is not None \
            and at.epoch >= at.epochs - 1

    # ------------------------------------------------------------- reading
    def detected(self, gen: int) -> float | None:
        """When generation `gen`'s failure was told."""
        failure = self.model.failures.get(gen)
        return None if failure is None else failure.t

    def victims(self, gen: int) -> list[tuple[str, str, int]]:
        """The started tasks of `gen` that end with the job: (task, host, pid)."""
        return [(v.name, v.host, v.pid) for v in self.model.tasks.values()
                if v.generation == gen and v.lifetime == "job" and v.pid is not None]

    def exit_of(self, gen: int, task: str) -> Exit | None:
        return self.history.exits.get((gen, task))

    def recovery(self, observed: Observed, gen: int) -> None:
        """What the generation after `gen`'s fault says: when it was detected,
        when the next trained, where it resumed (and a task behind the last save)."""
        observed.detected_t = self.detected(gen)
        observed.recovered_t = self.history.first_step(gen + 1)
        observed.resumed_from_step = self.history.resumed_at(gen + 1)
        observed.behind = self.behind_said(gen + 1)
        observed.unknown = self.history.unknown.get(gen + 1, "")

    def bad_step(self, gen: int) -> tuple[bool, int | None]:
        """(the sentinel saw generation `gen`'s loss go bad, at which step)."""
        bad = [e for e in self.model.nonfinite
               if isinstance(e, ev.Nonfinite) and e.generation == gen]
        return (True, bad[0].step) if bad else (False, None)

    def passed(self, gen: int) -> bool:
        """The launcher said generation `gen`'s replay passed the bad step before it."""
        return any(isinstance(e, ev.ReplayPassed) and e.generation == gen
                   for e in self.model.nonfinite)

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
            step = self.history.furthest(self.generation)
            if step is not None:
                self.disk_saves.append((self.clock(), step, self.generation))
                self.cond.notify_all()

    def saves(self) -> list[tuple[float, int, int]]:
        """The saves the script reported; if it reports none, those seen on disk."""
        if self.history.saves_reported:
            return [(s.t, s.step, s.generation) for s in self.history.saves]
        return self.disk_saves

    def saves_in(self, gen: int) -> int:
        return sum(1 for _, _, g in self.saves() if g == gen)

    def last_checkpoint(self, upto: int | None = None) -> int | None:
        """The step of the last save (of generations up to `upto`)."""
        saves = [c for c in self.saves() if upto is None or c[2] <= upto]
        return saves[-1][1] if saves else None


class Injector:
    """Injects `faults` into a started job, one after another, each once the
    job trains again after the last (run in a thread beside `job.run()`)."""

    def __init__(self, job: Job, heard: Heard, faults: list[str], *, grace_s: float,
                 checkpoint_wait_s: float, checkpoint_dir: str,
                 say: Callable[[str], None] = lambda _text: None) -> None:
        self.job, self.heard, self.faults = job, heard, faults
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
            if self.heard.ended is None:  # the drill is over: end the job
                self.say("drill: every fault injected; stopping the job")
                self.job.request_stop(signal.SIGTERM)

    # -------------------------------------------------------------- waiting
    def _wait(self, ready: Callable[[], Any], timeout: float) -> Any:
        """Wait until `ready()` (under the condition's lock) or the job ended."""
        deadline = time.monotonic() + timeout
        heard = self.heard
        while True:
            with heard.cond:
                value = ready()
                if value or heard.ended is not None or time.monotonic() >= deadline:
                    return value
                heard.cond.wait(POLL_S)
            self._look_at_disk()

    def _look_at_disk(self) -> None:
        if time.monotonic() < self._next_look:
            return
        self._next_look = time.monotonic() + DISK_EVERY_S
        now = checkpoints.checkpoint_state(self.checkpoint_dir)
        if checkpoints.advanced(self._disk, now):
            self.heard.on_disk_change()
        self._disk = now

    def _settle(self, first: bool) -> int:
        """Wait for the current generation to train and save: each fault comes
        right after the first save it sees (the bootstrap times each save, and
        the interval is read from the saves' steps: drill_report.report). A
        generation that resumed from a save into its last epoch has one already:
        its fault comes at its first step, while the training has steps left (a
        fault after `fit` ended finds its backup deleted, which proves nothing).
        Elsewhere each fault follows a save of its generation, so a restart the
        drill caused is progress and spends none of the user's max_restarts."""
        heard = self.heard
        self._wait(lambda: heard.history.first_step(heard.generation), RECOVER_WAIT_S)
        gen = heard.generation
        with heard.cond:
            resumed = heard.history.resumed_at(gen)
            saved = heard.last_checkpoint(upto=gen - 1)
            last = heard.in_last_epoch(gen)
        if gen > 0 and resumed and saved is not None and resumed >= saved and last:
            return gen
        self._wait(lambda: heard.saves_in(gen) >= 1, self.checkpoint_wait_s)
        return heard.generation

    # ------------------------------------------------------------ one fault
    def _one(self, fault: str, first: bool) -> Observed:
        heard = self.heard
        gen = self._settle(first)
        observed = Observed(fault, generation=gen, grace_s=self.grace_s,
                            strategy=str(self.job.connected.plan.strategy))
        with heard.cond:
            victims = heard.victims(gen)
            if heard.ended is not None:
                _ended_before(observed, heard.ended)
                return observed
            if not victims:
                observed.not_injected = f"no task was running to inject the {fault} into"
                return observed
            task, host, pid = victims[-1]  # the last worker: not the one that saves
            observed.victim = host if fault == "host" else f"{host}/{task}"
            observed.step_at_fault = heard.history.furthest(gen)
            observed.last_checkpoint_step = heard.last_checkpoint()
            observed.steps_per_s = _rate(heard.history.series({}))
            observed.saved_with, observed.saved_by_runtime = heard.saver  # the advice follows
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
        if fault == "nan" and not self._nan_seen(observed, gen):
            return observed
        self._wait(lambda: heard.detected(gen), DETECT_WAIT_S)
        self._wait(lambda: heard.history.first_step(gen + 1), RECOVER_WAIT_S)
        with heard.cond:
            heard.recovery(observed, gen)
            if observed.recovered_t is None and heard.ended is not None:
                observed.ended = (f"the job {heard.ended.status}"
                                  + (f": {heard.ended.message}" if heard.ended.message else ""))
            # What the faulted generation did until its teardown counts: its
            # peers may train and save on while a hang is being detected.
            observed.last_checkpoint_step = heard.last_checkpoint(upto=gen)
            furthest = heard.history.furthest(gen)
            if furthest is not None:
                observed.step_at_fault = max(observed.step_at_fault or 0, furthest)
            done = observed.recovered_t is None and heard.ended is not None \
                and heard.ended.status == "succeeded"
            if done or heard.history.finished_in(gen, but=task):  # the training ended
                observed.t0, observed.again = None, True  # again, in a job of its own
                observed.not_injected = (f"the job finished its training during the {fault}, "
                                         "with nothing left to resume: give it more steps")
                self.say(f"drill: {observed.not_injected}")
                return observed
        if fault == "nan" and observed.recovered_t is not None:
            self._replay(observed, gen)
        if observed.recovered_t is not None:
            self.say(f"drill: {fault}: training again {observed.recovered_t - t0:.1f} s after "
                     f"it, from step {observed.resumed_from_step}")
        return observed

    def _nan_seen(self, observed: Observed, gen: int) -> bool:
        """Wait for the sentinel to see the NaN's loss: the victim takes it at its
        next step (it says at which) and the loss is seen within a step or two."""
        heard = self.heard

        def seen_or_past() -> bool:
            at = heard.nan_at.get(gen)
            return heard.bad_step(gen)[0] or at is not None and \
                (heard.history.furthest(gen) or 0) >= at + NAN_STEPS
        self._wait(lambda: heard.bad_step(gen)[0] or gen in heard.nan_at, NAN_TAKEN_S)
        if gen in heard.nan_at:
            self._wait(seen_or_past, DETECT_WAIT_S)
        with heard.cond:
            (seen, observed.bad_step), at = heard.bad_step(gen), heard.nan_at.get(gen)
        if seen:
            return True
        observed.unseen = (
            f"the NaN went into {observed.victim}'s weights at step {at}, but no loss gone bad "
            f"was seen in the {NAN_STEPS} steps after it" if at is not None else
            f"{observed.victim} did not take the NaN within {NAN_TAKEN_S:g} s: it trains with "
            "no Keras `fit` the sentinel watches (a custom loop says its own loss: "
            "runtime.report_progress(step, loss=...))")
        self.say(f"drill: nan: {observed.unseen}")
        return False

    def _replay(self, observed: Observed, gen: int) -> None:
        """Wait for the launcher to say the replay passed the bad step (or it went bad)."""
        heard = self.heard
        if observed.bad_step is None:  # not read: the verdict cannot rest on it anyway
            return
        self._wait(lambda: heard.passed(gen + 1) or heard.bad_step(gen + 1)[0], RECOVER_WAIT_S)
        with heard.cond:
            observed.replay_bad = heard.bad_step(gen + 1)[0]
            observed.replay_past = heard.passed(gen + 1)

    def _send(self, host: str, message: dict[str, Any]) -> bool:
        link = self.job.supervisor.links.get(host)
        return link is not None and link.send(message)

    def _signal(self, host: str, task: str, signum: int) -> bool:
        return self._send(host, {"op": "signal", "task": task, "signum": int(signum),
                                 "by": "the drill"})  # said with its exit (job/record/classify.py)

    def _inject(self, fault: str, task: str, host: str,
                victims: list[tuple[str, str, int | None]]) -> bool:
        if fault == "kill":
            return self._signal(host, task, signal.SIGKILL)
        if fault == "preempt":
            return self._signal(host, task, signal.SIGTERM)
        if fault == "hang":
            return self._signal(host, task, signal.SIGSTOP)
        if fault == "nan":
            return self._send(host, {"op": "nan", "task": task, "within_s": NAN_TAKEN_S})
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
        heard, gen = self.heard, observed.generation

        def exited() -> Any:
            return heard.exit_of(gen, task) or heard.detected(gen)

        self._wait(exited, self.grace_s)
        with heard.cond:
            gone = exited()
            training = heard.history.trained_since(gen, task, t0 + 0.5)
        if not gone and not training:
            self._wait(exited, max(30.0, 2 * self.grace_s))
            with heard.cond:
                gone = exited()
            if not gone:
                observed.still_saving_s = time.time() - t0
        if not gone:
            self._signal(host, task, signal.SIGKILL)
        with heard.cond:
            exit_ = heard.exit_of(gen, task)
        if exit_ is None:  # its exit may follow the peers' failure: wait a little
            self._wait(lambda: heard.exit_of(gen, task), self.grace_s + 5.0)
            exit_ = heard.exit_of(gen, task)
        if exit_ is not None and exit_.exit_code == 42:
            observed.term_saved, observed.term_exit_t = True, exit_.t


def _ended_before(observed: Observed, ended: ev.JobDone) -> None:
    """The job ended before its fault could be injected: why, and whether to try again."""
    fault = observed.fault
    observed.again = ended.status == "succeeded"
    observed.not_injected = (
        f"the job finished before the {fault}: give it more steps to train"
        if ended.status == "succeeded" else
        f"the job {ended.status} before the {fault}: {ended.message or 'see its logs'}")


def _rate(series: list[list[Point]]) -> float | None:
    from ..views.drill_report import cost_and_rate

    return cost_and_rate(series)[1]
