"""Why is it stuck: live workers out of step, named from their positions.

Workers of MultiWorkerMirroredStrategy call the same collectives in the same
order. When one is somewhere else, every process is alive and each waits for
the others (or TensorFlow aborts on mismatched collectives). Each task reports
where it is with its progress (launcher/runtime/position.py): the phase
(training, evaluating, predicting, saving, outside them), the epoch, the step
counter at the epoch's start, how many steps the epoch has (steps_per_epoch or
the input's length) and how many the last finished epoch had. `judge` compares
them and names the task and the cause in the script's own terms:

- uneven input: the epochs' lengths differ, or one worker finished an epoch
  that another is still in;
- work on the chief only: one worker evaluates, predicts or saves while
  another trains;
- different step counts: one worker left `fit()` (or exited) while another
  still trains;
- custom loops: the workers began different distributed calls (a call on one
  worker only), or different numbers of them.

A finding is `strong` when the positions cannot agree again by themselves
(acted on once the whole job has been quiet for `quiet_needed`); a weak one (a
save on one worker only may merely be slow) only names the cause of a hang or
of a collective abort already found. Pure: no clock, no I/O; the watch
(launcher/job/detect/watch.py) feeds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..record.reports import ProgressReport
from ..record.states import Failure

TRAIN, EVALUATE, PREDICT, SAVE, OUTSIDE = "train", "evaluate", "predict", "save", "outside"
# A mismatch must outlast this much silence of the whole job, and three times
# the longest pause between two moves seen so far (a first step's tracing, a
# long evaluation, a save): positions differ for an instant at every epoch's end.
QUIET_S = 10.0
PAUSE_FACTOR = 3.0

UNEVEN_FIX = ("the workers' inputs have different lengths — repeat() the dataset and set "
              "steps_per_epoch, or give every worker a shard of the same length "
              "(drop_remainder=True)")
STEPS_FIX = ("the workers ran different numbers of steps (EarlyStopping on a value that "
             "differs per worker, or steps_per_epoch computed from each worker's own shard) "
             "— give every worker the same steps_per_epoch and epochs")
_ONLY_FIX = {
    EVALUATE: "evaluation runs on every worker under MultiWorkerMirroredStrategy (its metrics "
              "are all-reduced) — call evaluate() on every worker, not on the chief alone",
    PREDICT: "prediction runs on every worker under MultiWorkerMirroredStrategy — call "
             "predict() on every worker, not on the chief alone",
    SAVE: "saving runs collective ops on every worker under MultiWorkerMirroredStrategy — "
          "call save() on every worker, each to its own path (the chief's is the one kept)",
}


@dataclass(frozen=True)
class Position:
    """Where one task is, as its last reports said (launcher/runtime/position.py)."""

    phase: str = ""  # TRAIN, EVALUATE, PREDICT, SAVE, OUTSIDE; "": not reported
    step: int | None = None  # the step counter, the latest known
    phase_step: int | None = None  # the step counter at the last change of phase or epoch
    epoch: int | None = None  # Keras' index (0-based); shown 1-based, as Keras prints it
    epoch_from: int = 0  # the step counter at the epoch's start
    length: int = 0  # steps an epoch of this fit has (0: unknown)
    length_by: str = ""  # "steps_per_epoch" or "input" (the dataset's cardinality)
    epochs: int = 0  # the `epochs` of this fit (0: unknown)
    ended: tuple[int, int] | None = None  # (epoch, steps) of the last epoch finished
    stopping: bool = False  # fit raised after a callback set stop_training
    calls: int = 0  # a custom loop's distributed calls begun (runtime/calls.py)
    call: str = ""  # the last of them: "train_step", "strategy.reduce()"
    call_n: int = 0  # how many calls of that one so far

    def in_epoch(self) -> int:
        """Steps done in the current epoch (as far as known)."""
        return max(0, (self.step or 0) - self.epoch_from)

    def more_to_train(self) -> bool:
        """Its fit has steps left to run, as far as known (not merely in its
        last epoch's end: a chief-only callback there may be slow, not stuck)."""
        if self.length > 0 and self.in_epoch() < self.length:
            return True
        return self.epoch is not None and self.epoch + 1 < self.epochs


def read(data: dict[str, Any], before: Position) -> Position:
    """`before` updated by one progress report's fields."""
    changes: dict[str, Any] = {}
    if isinstance(data.get("at"), str):
        changes["phase"] = data["at"]
    for key, name in (("at_epoch", "epoch"), ("at_from", "epoch_from"), ("at_len", "length"),
                      ("at_step", "phase_step"), ("at_epochs", "epochs"),
                      ("at_calls", "calls"), ("at_call_n", "call_n")):
        if _int(data.get(key)) is not None:
            changes[name] = _int(data[key])
    if data.get("at_stopping"):
        changes["stopping"] = True
    if isinstance(data.get("at_call"), str):
        changes["call"] = data["at_call"]
    if isinstance(data.get("at_len_by"), str):
        changes["length_by"] = data["at_len_by"]
    ended = data.get("at_ended")
    if isinstance(ended, list) and len(ended) == 2 and all(_int(v) is not None for v in ended):
        changes["ended"] = (int(ended[0]), int(ended[1]))
    own = ProgressReport.read(data).own_step  # the step as the task counted it
    steps = [s for s in (own, changes.get("phase_step"), before.step) if s is not None]
    if "phase_step" in changes or own is not None:
        changes["step"] = max(steps)
    return replace(before, **changes) if changes else before


def mismatched(lines: Sequence[str]) -> bool:
    """TensorFlow saw two workers call different collectives ("Collective
    instance 301 expected type 0 and data_type 9 but got ... data_type 1",
    "Shape mismatch in the collective instance 266")."""
    return any(("Collective instance" in line and " expected " in line)
               or "Shape mismatch in the collective" in line for line in lines)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


@dataclass(frozen=True)
class Peer:
    """One worker as the judge sees it."""

    task: str  # its name, e.g. worker0
    at: Position
    finished: bool = False  # it exited 0


@dataclass(frozen=True)
class Finding:
    task: str  # the task out of step (the one the root cause names)
    cause: str  # uneven_input | chief_only | step_count | out_of_step
    reason: str  # said after the task's label, in the script's own terms
    strong: bool = True  # False: only names the cause of a hang or an abort


def judge(peers: Sequence[Peer], aborted: bool = False) -> Finding | None:
    """The cause when the workers' positions disagree (None: they agree, or
    too little is known). `aborted`: TensorFlow reported mismatched
    collectives, so differing step counters are evidence too."""
    known = [p for p in peers if p.at.phase or p.finished]
    if len(known) < 2:
        return None
    for rule in (_chief_only, _left_fit, _uneven_lengths, _epoch_ended, _calls_differ, _apart):
        finding = rule(known, aborted)
        if finding is not None:
            return finding
    return None


def foresee(peers: Sequence[Peer]) -> Finding | None:
    """Before anything is stuck: every worker in `fit` said how long its
    epochs are, and they differ (a warning at the first steps)."""
    training = _training(peers)
    if len(training) < 2 or len(training) < len(peers) or \
            any(p.at.length <= 0 for p in training):
        return None
    return _uneven_lengths(training, False)


def _training(peers: Sequence[Peer]) -> list[Peer]:
    return [p for p in peers if p.at.phase == TRAIN and not p.finished]


def _where(peer: Peer) -> str:
    """A worker's place in words: 'training (epoch 2, step 38)', 'finished'..."""
    at = peer.at
    if peer.finished:
        return "had finished"
    if at.phase == TRAIN:
        epoch = f"epoch {at.epoch + 1}, " if at.epoch is not None else ""
        return f"went on training ({epoch}step {at.step or 0})"
    if at.phase == OUTSIDE:
        return f"had left fit() at step {at.step or 0}"
    return f"is in {at.phase}() (step {at.step or 0})"


def _chief_only(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    for phase in (EVALUATE, PREDICT, SAVE):
        inside = [p for p in peers if p.at.phase == phase and not p.finished]
        others = [p for p in peers if p not in inside and p.at.phase != phase]
        if inside and others:
            one, other = inside[0], others[0]
            verb = "entered" if phase != SAVE else "is saving in"
            # A save on one worker may just be slow; a peer outside Keras' calls
            # may be on its way to the same one (loading its evaluation data).
            strong = phase != SAVE and (other.finished or other.at.phase != OUTSIDE)
            return Finding(one.task, "chief_only",
                           f"{verb} {phase}() at step {one.at.phase_step or one.at.step or 0}, "
                           f"{other.task} {_where(other)}: {_ONLY_FIX[phase]}", strong=strong)
    return None


def _left_fit(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    training = _training(peers)
    left = [p for p in peers if p.finished or p.at.phase == OUTSIDE]
    if not training or not left:
        return None
    one, other = left[0], training[0]
    how = "exited" if one.finished else "left fit()"
    fix = UNEVEN_FIX if _lengths_differ([one, other]) else STEPS_FIX
    # Left fit but still running: maybe on its way to the next fit (slow data).
    return Finding(one.task, "step_count",
                   f"{how} after step {one.at.step or 0}, {other.task} is still training "
                   f"({_in(other)}): {fix}", strong=one.finished and other.at.more_to_train())


def _in(peer: Peer) -> str:
    """'epoch 2, waiting in step 38's all-reduce'."""
    at = peer.at
    epoch = f"epoch {at.epoch + 1}, " if at.epoch is not None else ""
    return f"{epoch}waiting in step {(at.step or 0) + 1}'s all-reduce"


def _lengths_differ(peers: Sequence[Peer]) -> bool:
    lengths = {p.at.length for p in peers if p.at.length > 0}
    return len(lengths) > 1


def _uneven_lengths(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    training = [p for p in _training(peers) if p.at.length > 0]
    if not _lengths_differ(training):
        return None
    short = min(training, key=lambda p: p.at.length)
    long = max(training, key=lambda p: p.at.length)
    n, m = short.at.length, long.at.length
    epoch = f" of epoch {short.at.epoch + 1}" if short.at.epoch is not None else ""
    # Before the shorter epoch's end a quiet spell is no proof (a slow input).
    strong = max(short.at.in_epoch(), long.at.in_epoch()) >= n
    if short.at.length_by == "steps_per_epoch" or long.at.length_by == "steps_per_epoch":
        return Finding(short.task, "step_count",
                       f"runs {n} steps an epoch and {long.task} {m} (steps_per_epoch differs "
                       f"between workers): {short.task} leaves the epoch after step {n}{epoch} "
                       f"while {long.task} waits in step {n + 1}'s all-reduce — give every "
                       "worker the same steps_per_epoch (the dataset's length is per worker)",
                       strong=strong)
    return Finding(short.task, "uneven_input",
                   f"has {n} batches an epoch and {long.task} {m} (fit() without "
                   f"steps_per_epoch): {short.task}'s input ends after step {n}{epoch} while "
                   f"{long.task} waits in step {n + 1}'s all-reduce: {UNEVEN_FIX}",
                   strong=strong)


def _epoch_ended(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    """One worker finished an epoch another is still in: its input ran out first."""
    training = _training(peers)
    for one in training:
        if one.at.ended is None:
            continue
        epoch, steps = one.at.ended
        for other in training:
            behind = other.at.epoch == epoch and (other.at.ended or (-1, 0))[0] < epoch
            if other is not one and behind and other.at.in_epoch() >= steps:
                # Strong: an epoch's end is marked before the script's callbacks
                # run (runtime/position.py), so `other` is not in a slow one.
                return Finding(one.task, "uneven_input",
                               f"finished epoch {epoch + 1} after {steps} steps, {other.task} "
                               f"is waiting in step {other.at.in_epoch() + 1}'s all-reduce of "
                               f"epoch {epoch + 1}: {UNEVEN_FIX}")
    return None


def _calls_differ(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    """Custom loops (no fit running): the distributed calls each worker began.
    Different calls at the same count: one worker makes a call the others
    never make (the odd one is the rarer call, e.g. a metric's `result()`
    reduced on the chief only, against the 11th `train_step`). Counts apart
    are weaker: a call without collectives made on one worker only offsets
    the counts for good, healthy; and one apart is also what a plain hang
    looks like (the peer waits in the next call): no finding."""
    looping = [p for p in peers if p.at.phase in (OUTSIDE, SAVE) and p.at.calls > 0
               and not p.finished]
    if len(looping) < 2 or len(looping) < len([p for p in peers if not p.finished]):
        return None
    counts = {p.at.calls for p in looping}
    if max(counts) - min(counts) == 1:
        return None
    if len({p.at.call for p in looping}) > 1:
        one = min(looping, key=lambda p: p.at.call_n)
        other = next(p for p in looping if p.at.call != one.at.call)
        return Finding(one.task, "chief_only",
                       f"is in {one.at.call} (its distributed call {one.at.calls}, "
                       f"{_nth(one.at.call_n)} of its kind), {other.task} in {other.at.call} "
                       f"(its call {other.at.calls}): every worker must make the same "
                       "distributed calls in the same order — a strategy.run()/reduce(), a "
                       "tf.function with collectives or a metric's result() called on one "
                       "worker only (under `if chief:`) waits for peers that never call it",
                       strong=len(counts) == 1)
    if len(counts) < 2:
        return None
    fewer = min(looping, key=lambda p: p.at.calls)
    more = max(looping, key=lambda p: p.at.calls)
    return Finding(fewer.task, "step_count",
                   f"began {fewer.at.calls} distributed calls ({fewer.at.call}), {more.task} "
                   f"{more.at.calls}: the workers ran different numbers of steps — a loop "
                   "over each worker's own data ends sooner on the shorter one: repeat() the "
                   "dataset and run the same number of steps on every worker", strong=False)


def _nth(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 < 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _apart(peers: Sequence[Peer], aborted: bool) -> Finding | None:
    """At a mismatched-collective abort only: training at different steps (or
    epochs) when the collectives stopped matching. Weak: names an abort."""
    training = _training(peers)
    places = {(p.at.epoch, p.at.step) for p in training}
    if not aborted or len(training) < 2 or len(places) < 2:
        return None
    behind = min(training, key=lambda p: ((p.at.epoch or 0), p.at.step or 0))
    ahead = max(training, key=lambda p: ((p.at.epoch or 0), p.at.step or 0))
    stopped = [p for p in training if p.at.stopping]
    if stopped and len(stopped) < len(training):  # told by the task itself: no stale counter
        one, other = stopped[0], next(p for p in training if not p.at.stopping)
        return Finding(one.task, "step_count",
                       f"stopped training after step {one.at.step or 0} (a callback set "
                       f"stop_training), {other.task} went on to step {other.at.step or 0}: "
                       f"{STEPS_FIX}", strong=False)
    return Finding(behind.task, "out_of_step",
                   f"was at step {behind.at.step or 0} and {ahead.task} at step "
                   f"{ahead.at.step or 0} when their collectives stopped matching: the workers "
                   f"ran different numbers of steps ({_fixes()})", strong=False)


def _fixes() -> str:
    return ("uneven input: repeat() and steps_per_epoch; EarlyStopping or a per-worker "
            "steps_per_epoch: the same steps on every worker")


@dataclass
class Positions:
    """Every task's position in one generation, and when the job last moved
    (monotonic times handed in: the watch's clock)."""

    at: dict[str, Position] = field(default_factory=dict)
    moved_at: float | None = None  # the last change of any task's position or step
    longest_pause_s: float = 0.0  # between two moves, after the first step
    judged: bool = False  # a finding named the root cause already (for good)
    # The collective abort whose cause the positions named (named again as
    # later reports arrive: job/detect/blame.py abort_out_of_step).
    abort: Failure | None = None
    warned: bool = False  # `foresee` warned already

    def take(self, task: str, data: dict[str, Any], now: float) -> Position:
        """One progress report of `task`; its position now."""
        before = self.at.get(task, Position())
        after = read(data, before)
        if after != before:
            self.at[task] = after
            if self.moved_at is not None and any(p.step for p in self.at.values()):
                self.longest_pause_s = max(self.longest_pause_s, now - self.moved_at)
            self.moved_at = now
        return after

    def quiet_needed(self) -> float:
        return max(QUIET_S, PAUSE_FACTOR * self.longest_pause_s)

    def quiet_s(self, now: float) -> float:
        return 0.0 if self.moved_at is None else now - self.moved_at
