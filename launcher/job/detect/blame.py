"""Who is to blame: the culprit behind a collective abort, a worker out of
step with the others, a failure that repeats, the frames a stuck task was in.
Pure functions over the generation's values; the supervisor follows them.
"""

from __future__ import annotations

import re

from ...strategy import framework as strategy_framework
from ..record.failkinds import Kind, say, traits
from ..record.states import Failure, TaskRecord, TaskState
from .generation import Generation
from .lockstep import Finding, Peer, Position, judge, mismatched


def culprit(gen: Generation, reporter: TaskRecord) -> Failure | None:
    """A collective abort is a symptom; the peer behind it when known: the one
    TF names a line after the abort ("stopped sending heartbeats"), else a
    peer its agent saw stopped (SIGSTOP): when the coordination leader itself
    is stopped, the others only see a deadline pass. None: no one else to blame."""
    failure = gen.failure
    if failure is None or not traits(failure.kind).blames_a_peer \
            or failure.task != reporter.task.label:
        return None
    named = reporter.watcher.culprit
    blamed = gen.record_of(*named) if named else None
    framework = strategy_framework(gen.plan.strategy)
    how = "named_by_peer"
    if blamed is None:
        blamed = next((r for r in gen.records.values()
                       if r is not reporter and r.usage.get("status") == "stopped"), None)
        how = "seen_stopped"
    if blamed is None:  # no peer died or hung: maybe one was elsewhere in the program
        return abort_out_of_step(gen, weak=False)
    if blamed is reporter:
        return None
    return Failure(task=blamed.task.label, host=blamed.task.host,
                   generation=gen.plan.generation, t=failure.t, kind=Kind.HANG,
                   reason=say(Kind.HANG, how, {"framework": framework,
                                               "reporter": reporter.task.label}),
                   last_lines=failure.last_lines)


def workers(gen: Generation) -> list[Peer]:
    """The generation's workers and where each is (job/detect/lockstep.py)."""
    return [Peer(r.task.name, gen.positions.at.get(r.task.name, Position()),
                 finished=r.state is TaskState.SUCCEEDED)
            for r in gen.records.values()
            if r.task.role in ("chief", "worker") and r.task.lifetime == "job"]


def out_of_step(gen: Generation, aborted: bool = False,
                weak: bool = False) -> tuple[TaskRecord, Finding] | None:
    """The worker out of step and why, from every worker's position
    (job/detect/lockstep.py); a weak finding only when `weak` (a hang, an abort)."""
    finding = judge(workers(gen), aborted=aborted)
    if finding is None or not (finding.strong or weak) or finding.task not in gen.records:
        return None
    return gen.records[finding.task], finding


def abort_out_of_step(gen: Generation, weak: bool = True) -> Failure | None:
    """A collective abort's real cause when the workers were out of step, or
    a better one than named before: the tasks' last reports (at their exit)
    trail the abort, and a step counter read two seconds earlier misleads
    (`weak=False` at the abort itself: only what stale counters cannot fake)."""
    failure, positions = gen.failure, gen.positions
    abort = positions.abort or failure
    if failure is None or abort is None or not traits(abort.kind).blames_a_peer \
            or positions.judged or not traits(failure.kind).rejudged_by_positions:
        return None  # another cause (a peer TF named) stands
    aborted = mismatched(abort.last_lines)  # TF saw different collectives meet
    found = out_of_step(gen, aborted=aborted, weak=aborted and weak)
    if found is None:
        return None
    record, finding = found
    better = Failure(task=record.task.label, host=record.task.host,
                     generation=gen.plan.generation, t=abort.t, kind=Kind.OUT_OF_STEP,
                     reason=say(Kind.OUT_OF_STEP, "aborted",
                                {"cause": finding.reason, "reporter": abort.task}),
                     last_lines=abort.last_lines)
    if (better.task, better.reason) == (failure.task, failure.reason):
        return None
    positions.abort = abort
    return better


def lost_peer_out_of_step(gen: Generation, failure: Failure) -> Failure | None:
    """A task that failed on a lost peer (gRPC UNAVAILABLE...) while a peer had
    finished cleanly: the workers' positions may name the real cause, as a
    collective abort's do (an evaluate() on the chief alone, its peer done). Under
    load TensorFlow's error comes before the quiet that would have named it."""
    if not failure.secondary or not any(
            r.state is TaskState.SUCCEEDED for r in gen.records.values()
            if r.task.role in ("chief", "worker") and r.task.lifetime == "job"):
        return None
    found = out_of_step(gen, aborted=True, weak=True)
    if found is None:
        return None
    record, finding = found
    return Failure(task=record.task.label, host=record.task.host,
                   generation=gen.plan.generation, t=failure.t, kind=Kind.OUT_OF_STEP,
                   reason=say(Kind.OUT_OF_STEP, "aborted",
                              {"cause": finding.reason, "reporter": failure.task}),
                   last_lines=failure.last_lines)


def repeated_failure(failures: list[Failure]) -> str:
    """The last failure's description when it repeats the one before it: the
    same exception type raised at the same innermost frame. "" otherwise."""
    if len(failures) < 2:
        return ""
    last, before = failures[-1], failures[-2]
    if last.secondary or before.secondary:
        return ""  # a peer's loss seen twice (gRPC UNAVAILABLE...): not the script's bug
    if last.kind == before.kind and traits(last.kind).repeats_by_position \
            and last.task == before.task \
            and _out_of_step_cause(last) == _out_of_step_cause(before):
        return f"{last.task} out of step: {_out_of_step_cause(last)}"  # the script's own order
    if last.kind == before.kind and traits(last.kind).repeats_by_kind:
        return f"{last.task} {last.reason}"  # a port taken again: fresh ports did not mend it
    where = innermost_frame(last.error)
    if where is None or where != innermost_frame(before.error):
        return ""
    kind, path, line, function = where
    return f"{kind} at {path}:{line} in {function}, in {last.task}"


def _out_of_step_cause(failure: Failure) -> str:
    """Its fix, the part after the positions (which differ from try to try)."""
    return failure.reason.split(": ", 1)[-1].split(" (", 1)[0]


def last_words(record: TaskRecord) -> str:
    return repr(record.tail[-1][:200]) if record.tail else "nothing"


def innermost_frames(stacks: str, count: int = 5) -> tuple[str, ...]:
    """The innermost frames of the main thread in a faulthandler dump.

    faulthandler lists threads newest first, so the main thread (the oldest)
    comes last; within a thread the most recent call comes first.
    """
    blocks: list[list[str]] = []
    for line in stacks.splitlines():
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([])
        elif blocks and line.strip().startswith("File "):
            blocks[-1].append(line.strip())
    with_frames = [block for block in blocks if block]
    return tuple(with_frames[-1][:count]) if with_frames else ()


def innermost_frame(error: dict | None) -> tuple[str, str, str, str] | None:
    """(exception type, file, line, function) of a task's uncaught exception,
    from its error report; None without one. Two failures with the same value
    raised the same exception at the same place."""
    if not isinstance(error, dict):
        return None
    kind = error.get("type")
    frames = _FRAME.findall(str(error.get("traceback") or ""))
    if not isinstance(kind, str) or not frames:
        return None
    path, line, function = frames[-1]
    return kind, path, line, function


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
