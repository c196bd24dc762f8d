"""The kinds of failure a generation can have, declared once: each kind's name
(what `failure_detected`, `root_cause` and summary.json's `kind` hold) and what
the code asks of it. Nothing else compares a kind's name; a new kind is a row
of `KINDS` plus the detector that finds it (docs/design.md, "A new failure kind").

`Kind` is a `StrEnum`, like launcher/strategy.py's `Strategy`: a member equals
its name as events.jsonl writes it, so events and summary.json keep strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Kind(StrEnum):
    EXIT = "exit"  # a non-zero exit
    SIGNAL = "signal"  # killed by a signal
    PREEMPTED = "preempted"  # exit 42: saved a checkpoint, asked to be restarted
    START_FAILED = "start_failed"  # its agent could not start it
    START_TIMEOUT = "start_timeout"  # not started, or the cluster not formed, in time
    HANG = "hang"  # no progress for restart.hang_timeout_s, or frozen (SIGSTOP)
    HOST_LOST = "host_lost"  # its host's agent went silent or its link closed
    COLLECTIVE_ABORT = "collective_abort"  # TensorFlow aborted its collective ops
    OUT_OF_STEP = "out_of_step"  # live, but elsewhere in the program than its peers
    STRAGGLER = "straggler"  # set aside for a spare (restart.on_straggler: replace)
    NONFINITE = "nonfinite"  # its loss went inf or NaN (the NaN sentinel: job/detect/sentinel.py)
    OOM = "oom"  # SIGKILL by the kernel's out-of-memory killer (agent/evidence.py's facts)
    PORT_TAKEN = "port_taken"  # its TF server's port was taken before it bound it (exit_of)


# Exit reasons (the words of `_EXITED`'s "unavailable" and "deadline") that
# follow from a peer's failure.
SYMPTOM_REASONS = ("gRPC UNAVAILABLE", "collective timed out")


@dataclass(frozen=True)
class Traits:
    """What the supervisor, the teardown, the restart rules and the views ask of a kind."""

    # A symptom of another task's failure, never the root cause when the
    # primary one is known; `symptom_reasons`: only when its reason starts so.
    secondary: bool = False
    symptom_reasons: tuple[str, ...] = ()
    # Something is stuck: the tasks' Python stacks are taken before the teardown.
    stuck: bool = False
    # Asked to be restarted: its peers save a checkpoint too (the full grace),
    # and its restart is free of the budget (recovery.restart_counts).
    preempted: bool = False
    # A symptom whose culprit later output may name: a peer TF blames, or a
    # worker out of step (job/detect/blame.py).
    blames_a_peer: bool = False
    # Positions reported after it may name a better out-of-step cause (blame.abort_out_of_step).
    rejudged_by_positions: bool = False
    # It repeats when the same task is out of step for the same cause (blame.repeated_failure).
    repeats_by_position: bool = False
    # Its start never happened: the task is over (a version-1 run wrote no start_failed event).
    ends_the_start: bool = False
    # Not the script's bug: its first occurrence in a job is free of max_restarts
    # (`free_first`, recovery.decide_restart), said by `free_words` in the restart's
    # line ("the first ..., not counted against ..."); the same again stops the job
    # (the sentinel's `again`; `repeats_by_kind`: blame.repeated_failure).
    free_first: bool = False
    free_words: str = ""
    # Twice in a row is the same failure, whichever task, port or step
    # (blame.repeated_failure): another restart would not mend it.
    repeats_by_kind: bool = False
    # Its words: the part of the failure's sentence after "TASK (host H,
    # generation G)", by how it was found, filled in from the finding's fields
    # (`say`). "": when an event carries no reason (`{exit_code}`, `{signal}`).
    words: Mapping[str, str] = field(default_factory=dict)


# A task's exit (kinds exit, signal, preempted), as classify.exit_words reads
# its code, signal, error and last lines, most specific first. `{hint}`: "" or
# " — " and a hint (classify.TF_KERAS_HINT).
_EXITED = {
    "sigkill": "killed (SIGKILL: by a user, or the kernel's out-of-memory killer — "
               "check `dmesg` for oom-kill)",
    # its host's oom_kill counter moved while it ran (agent/evidence.py): any process's
    "sigkill_oom_on_host": "killed (SIGKILL); the kernel's out-of-memory killer killed "
                           "{count} process(es) on its host while it ran: check `dmesg` for "
                           "this task's pid",
    "signal": "killed by signal {signal} ({name})",
    # a signal its agent sent when asked (`by`: the drill's faults)
    "killed_by": "killed (SIGKILL from {by})",
    "preempted_term": "preempted (SIGTERM from {by})",
    "preempted_kill": "preempted (SIGTERM from {by}, then SIGKILL after {after_s:.1f} s)",
    "restart_me": "preempted: saved a checkpoint and asked to be restarted (exit 42)",
    "deadline": "collective timed out (DeadlineExceeded): a peer stopped taking part",
    "unavailable": "gRPC UNAVAILABLE: lost a peer (it died, hung, or the network dropped)",
    "exception": "Python exception {type}: {message}{hint}",
    "code": "exited with code {exit_code}{hint}",
}
_PEER_NAMED = {
    # TF's coordination service named it in a peer's collective abort.
    "named_by_peer": "stopped sending {framework} heartbeats (hung, stopped, or cut off); "
                     "reported by {reporter}",
    # Its agent saw it stopped when a peer's collectives aborted.
    "seen_stopped": "was stopped (SIGSTOP, Ctrl-Z or a debugger): its peers' collectives "
                    "aborted; reported by {reporter}",
}


KINDS: dict[Kind, Traits] = {
    Kind.EXIT: Traits(symptom_reasons=SYMPTOM_REASONS, words={
        "": "exited with code {exit_code}", **_EXITED}),
    Kind.SIGNAL: Traits(words={"": "was killed by signal {signal}", **_EXITED}),
    Kind.PREEMPTED: Traits(preempted=True, words=_EXITED),
    Kind.START_FAILED: Traits(ends_the_start=True, words={"agent": "could not start: {error}"}),
    Kind.START_TIMEOUT: Traits(stuck=True, words={
        "not_started": "{count} task(s) not started (its agent never confirmed the start) "
                       "within restart.start_timeout_s={limit_s:g}: {named}",
        "not_joined": "{count} task(s) not joined the cluster within "
                      "restart.start_timeout_s={limit_s:g}: {named}",
        "each": "{task} (last output: {last})"}),  # one of `named`, joined by "; "
    Kind.HANG: Traits(stuck=True, words={
        "silent": "made no progress for {silent_s:.0f} s (no output, no progress report; "
                  "restart.hang_timeout_s={limit_s:g})",
        "frozen": "was stopped (SIGSTOP, Ctrl-Z or a debugger) for {span_s:.1f} s (a freeze "
                  "over {limit_s:g} s is a hang): its peers cannot go on without it",
        **_PEER_NAMED}),
    Kind.HOST_LOST: Traits(words={
        "lost": "lost its host: {detail}",
        # the detail of a host lost by silence (a `host_lost` event's `detail`)
        "silent_agent": "no heartbeat from its agent for {silent_s:.0f} s"}),
    # Its host's evidence (launcher/agent/evidence.py), read by classify.exit_of.
    Kind.OOM: Traits(words={
        "cgroup": "killed by the kernel's out-of-memory killer: its memory cgroup's limit "
                  "({limit}) was reached"}),
    Kind.COLLECTIVE_ABORT: Traits(secondary=True, blames_a_peer=True,
                                  rejudged_by_positions=True, words={
        "output": "aborted its collective ops ({code}): a peer died or hung"}),
    # `{cause}`: job/detect/lockstep.py's finding, where each worker is in the script's terms.
    Kind.OUT_OF_STEP: Traits(stuck=True, rejudged_by_positions=True, repeats_by_position=True,
                             words={
        "quiet": "{cause} (nothing moved for {quiet_s:.0f} s)",
        "silent": "{cause} (no progress for {silent_s:.0f} s; "
                  "restart.hang_timeout_s={limit_s:g})",
        "aborted": "{cause} (TensorFlow aborted the collectives: {reporter})"}),
    # The words of TF's bind failure (add_port.cc's line, or "Could not start gRPC
    # server"), read by classify.exit_of; `{port}`: the add_port line's, else the
    # plan's. "chosen": the launcher picks the ports (`ports.base: auto`, simulated
    # hosts: job/run/reach.py's Reach.plan), "fixed": the same port again.
    Kind.PORT_TAKEN: Traits(free_first=True, repeats_by_kind=True,
                            free_words="the first port taken (not the script's bug)", words={
        "chosen": "could not start: port {port} on {host} was taken before its task bound it "
                  "(something else listens there); the restart takes fresh ports",
        "fixed": "could not start: port {port} on {host} was taken before its task bound it "
                 "(something else listens there): free port {port} on {host}, or set another "
                 "`ports.base` (`mgpu-launch check` tries them; fixed ports: the restart "
                 "binds the same port)"}),
    # Epoch and batch counted from 1, as Keras' progress bar counts them.
    Kind.NONFINITE: Traits(free_first=True,
                           free_words="the first loss or weights gone non-finite", words={
        "loss": "its loss went {loss} at step {step} (epoch {epoch_1}, batch {batch_1} of it): "
                "stopped before it saves NaN weights; the restart resumes from the last save "
                "before it (the NaN sentinel; `sentinel: off` turns it off)",
        "spike": "its loss spiked to {loss:.4g} at step {step} (epoch {epoch_1}, batch {batch_1} "
                 "of it), {z:.0f} robust standard deviations above the median {median:.4g} of "
                 "its recent steps: stopped, and the restart resumes from the last save "
                 "before it (sentinel.on_spike: rollback)",
        "save": "its weights were not finite at its save of step {step} in {directory}, "
                "with no loss gone bad seen (a custom loop's loss is its own: "
                "`runtime.report_progress(step, loss=...)` names the step): not counted as a "
                "save; stopped, and the restart resumes from the last save before it (the "
                "NaN sentinel; `sentinel: off` turns it off)",
        "weights": "its weights were not finite at its save of step {step} in {directory}, "
                   "though its loss was: a weight the loss does not read (a "
                   "BatchNormalization's moving statistics) or a NaN it hides (a fused "
                   "ReLU maps NaN to 0): not counted as a save; stopped, and the restart "
                   "resumes from the last save before it (the NaN sentinel; "
                   "`sentinel: off` turns it off)"}),
    Kind.STRAGGLER: Traits(words={
        "replaced": "replaced by a spare host at a checkpoint: {slowdown:.2g}x slower than "
                    "its peers (restart.on_straggler: replace)"}),
}

_UNKNOWN = Traits()  # a kind a newer launcher wrote: asks nothing


def traits(kind: str | None) -> Traits:
    """What `kind` is (a name as events.jsonl holds it; unknown: nothing special)."""
    try:
        return KINDS[Kind(kind)]
    except ValueError:
        return _UNKNOWN


def secondary(kind: str, reason: str) -> bool:
    """A symptom of another task's failure (a collective aborted because a peer vanished)."""
    found = traits(kind)
    return found.secondary or (bool(found.symptom_reasons)
                               and reason.startswith(found.symptom_reasons))


def free_first(kinds: Sequence[str]) -> bool:
    """The last of a job's failure `kinds` (oldest first) is free of max_restarts:
    its kind is not the script's bug (`free_first`) and this is its first in the job."""
    return bool(kinds) and traits(kinds[-1]).free_first and kinds[-1] not in kinds[:-1]


def say(kind: str, how: str, facts: Mapping[str, Any]) -> str:
    """The words of a `kind` found `how` (a key of its row's `words`), with `facts` filled in."""
    return KINDS[Kind(kind)].words[how].format(**facts)


def words(kind: str | None, exit_code: int | None, signal: int | None) -> str:
    """A failure in words when its event has no reason: its kind's, else its name."""
    template = traits(kind).words.get("")
    return template.format(exit_code=exit_code, signal=signal) if template else str(kind)
