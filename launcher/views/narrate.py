"""The run's story in words: each event of launcher/job/record/events.py to the line a
person reads in the terminal, in one place.

`line(event)` is pure: an event in, `("notice" | "debug", text)` out, or None
for an event the terminal does not tell (a progress report, a task start, the
job's phase: the live table and `status` show those). The printer calls it for
every event the supervisor tells it (`Printer.tell`). The launch's facts that
are values, not events, are worded here too (`checkpoint_moved`).

Must not import: supervisor, transport, cli.
"""

from __future__ import annotations

import signal as signals

from ..job.detect.checkpoints import Moved
from ..job.detect.stragglers import describe as describe_evidence
from ..job.record import events as ev
from ..job.record.failkinds import Kind, traits
from ..job.record.states import sentence

Said = tuple[str, str]  # ("notice" | "debug", text)


def line(event: ev.Event) -> Said | None:
    """The line a person reads for `event`, or None."""
    teller = _TELLERS.get(type(event))
    text = teller(event) if teller is not None else None
    if text is None:
        return None
    if isinstance(event, ev.BadMessage | ev.AgentLog) and not getattr(event, "notice", False):
        return "debug", text
    return "notice", text


def _failure(event: ev.FailureDetected) -> str:
    return "failure: " + sentence(event.label, event.host, event.generation, event.reason)


def _root_cause(event: ev.RootCause) -> str:
    return "root cause: " + sentence(event.label, event.host, event.generation, event.reason)


def _restart(event: ev.Restart) -> str:
    """Each budget in what it counts: `restart.max_restarts` the restarts
    without progress, `restart.max_total_restarts` all of them."""
    allowed = f"the {event.max_restarts} allowed without progress"
    free = "preempted" if event.preempted else "a bad batch skipped" if event.skipped \
        else "the checkpoint advanced" if event.progress \
        else traits(event.free).free_words or f"the first {event.free} failure" if event.free \
        else traits(Kind.NONFINITE).free_words  # a run before `free`: the NaN sentinel's
    why = f"{event.spent} of {allowed}" if event.counted else \
        f"{free}, not counted against {allowed}"
    fence = event.fence_s or 0.0
    wait = f"{event.backoff_s + fence:g} s" + (
        f", {fence:g} s of it until the lost host's tasks are surely over" if fence else "")
    return (f"restarting as generation {event.generation} in {wait} (restart "
            f"{event.total}: {why}; at most {event.max_total_restarts} in all); workers resume "
            "from the last checkpoint")


def _stop(event: ev.StopRequested) -> str:
    name = signals.Signals(event.signal).name if event.signal else "stop"
    return (f"{name}: stopping every task (SIGTERM, SIGKILL after {event.grace_s or 0:g} s; "
            "press Ctrl-C again to kill now)")


def _teardown(event: ev.TeardownBegun) -> str | None:
    # Servers (ps, PS-strategy workers) never exit by themselves.
    return "training finished; stopping the servers" if event.why == "finished" else None


def _stacks_requested(event: ev.StacksRequested) -> str:
    return f"taking the Python stacks of {len(event.tasks)} task(s) before stopping them"


def _task_restarted(event: ev.TaskRestarted) -> str:
    return ("failure: " + sentence(event.label, event.host, event.generation, event.reason)
            + "; ParameterServerStrategy reschedules its work: restarting that worker alone")


def _reaped(event: ev.Reaped) -> str:
    return (f"host {event.host}: stopped {event.count} leftover task(s) of an earlier agent "
            f"of this job ({', '.join(event.tasks)})")


def _resumed(event: ev.Resumed) -> str:
    if event.unknown:
        return (f"generation {event.generation} restored a checkpoint, at a step that cannot "
                f"be told: {event.unknown}")
    where = []
    if event.epoch is not None:
        where.append(f"epoch {event.epoch}")
    if event.step is not None:
        where.append(f"step {event.step}" if not where else f"(step {event.step})")
    if (event.epoch or 0) == 0 and (event.step or 0) == 0:
        return (f"generation {event.generation} started from the beginning "
                "(no checkpoint restored)")
    said = f"generation {event.generation} resumed at {' '.join(where)}"
    if event.copy:  # the memory tier: which copy was read
        said += {"memory": f" (from memory on {event.copy.get('host')})",
                 "peer": f" (from a copy in memory that came from {event.copy.get('host')})"
                 }.get(str(event.copy.get("from")), " (from the checkpoint directory)")
    if event.past is not None:
        before = event.generation - 1  # where it began (0) or resumed: not a save's step
        said += (f", past where generation {before} {'began' if before == 0 else 'resumed'} "
                 f"(step {event.past}): that restart is progress")
    return said


def _resume_behind(event: ev.ResumeBehind) -> str:
    return (f"warning: {event.task} resumed at step {event.step}, behind the last save (step "
            f"{event.saved_step} in {event.directory or 'its checkpoint directory'}, by "
            f"{event.by}): that directory is not what {event.task} restores from; keep "
            "checkpoints in a directory every host shares (checkpoint.dir), not one "
            "local to each host")


def _passed_over(event: ev.CheckpointPassedOver) -> str:
    kept = f"; its files are kept in {event.kept_in}" if event.kept_in else ""
    return (f"warning: {event.task} passed over checkpoint {event.checkpoint}: it cannot be "
            f"read ({event.why or 'damaged'}); restored {event.restored or 'an older one'} "
            f"instead{kept}")


def _nonfinite(event: ev.Nonfinite) -> str:
    """Epoch and batch counted from 1 here, as Keras' progress bar counts them."""
    step = f"step {event.step}" if event.step is not None else "a step"
    return (f"warning: {event.label}'s loss went {event.loss or 'non-finite'} at {step} "
            f"(epoch {event.epoch + 1}, batch {event.batch + 1} of it; generation "
            f"{event.generation}): its weights and its peers' are NaN from there on; saves "
            "of non-finite weights are not counted as saves")


def _batch_skipped(event: ev.BatchSkipped) -> str:
    """Epoch and batch counted from 1, as the `nonfinite` warning counts them."""
    return (f"skipping batch {event.batch + 1} of epoch {event.epoch + 1} (step {event.step}): "
            "its loss went bad (non-finite, or a spike rolled back) at that step twice, after a "
            "restart from the save "
            f"before it; {event.skips} of sentinel.max_skips={event.max_skips}")


def _batch_skip_done(event: ev.BatchSkipDone) -> str:
    """Epoch and batch counted from 1, as the `nonfinite` warning counts them."""
    where = f"batch {event.batch + 1} of epoch {event.epoch + 1}"
    at = f" at step {event.step}" if event.step is not None else ""
    if event.done:
        return f"{event.label} skipped {where}{at}: read and dropped, not trained"
    return (f"{event.label} trained {where}{at}, not skipped: another fit of the script at that "
            "position, not the step that went bad")


def _replay_passed(event: ev.ReplayPassed) -> str:
    said = (f"generation {event.generation} trained past step {event.step}, where the loss "
            f"went bad in generation {event.generation - 1}")
    if not event.exact:  # Keras 3 starts its input over: another batch was at that step
        return (f"{said}: it did not come back there, but whether it was one-off or its batch "
                "cannot be told: the replay's input at that step was not the same one")
    first = (f"; {event.first} reported it first (the loss is reduced across the workers: "
             "the device that made it may be any host's)") if event.first else ""
    return (f"{said}: a one-off fault, not its batch (the replay read the same input at that "
            f"step){first}")


def _loss_spike(event: ev.LossSpike) -> str:
    then = ("the generation is stopped and rolled back (sentinel.on_spike: rollback)"
            if event.rollback else "training goes on (`sentinel: {on_spike: rollback}` "
            "would roll it back)")
    return (f"warning: {event.label}'s loss spiked to {event.loss:.4g} at step {event.step} "
            f"(epoch {event.epoch + 1}, batch {event.batch + 1} of it; generation "
            f"{event.generation}), {event.z:.0f} robust standard deviations above the median "
            f"{event.median:.4g} of its recent steps: {then}")


def _nonfinite_save(event: ev.NonfiniteSave) -> str:
    at = f" of step {event.step}" if event.step is not None else ""
    what = ("weights trained past a loss spike that is rolled back (sentinel.on_spike: "
            "rollback)" if event.after_spike else "non-finite weights")
    return (f"warning: {event.label} saved {what}{at} in "
            f"{event.directory or 'its checkpoint directory'}: not counted as a save "
            "(no progress, no resume point)")


def _keras(event: ev.KerasSwitched) -> str:
    return (f"{event.task} failed of tf_keras (Keras 2) code under Keras 3: generation "
            f"{event.generation} runs under tf_keras (TF_USE_LEGACY_KERAS=1); set "
            "`keras: tf_keras` in the cluster file to start under it")


def _memory_copy(event: ev.MemoryCopy) -> str | None:
    """A placed copy and a failed one are said; a save's routine second copy is not."""
    what = f"memory tier: {event.checkpoint} of {event.origin}"
    if event.error:
        return f"{what}: its copy from {event.source} to {event.host}'s memory failed: " \
            f"{event.error}"
    if not event.placed:
        return None
    return (f"{what} placed in {event.host}'s memory from {event.source}'s for the restart "
            f"({event.bytes / 1e6:.1f} MB in {event.seconds:.1f} s, sha256 checked)")


def _agent_log(event: ev.AgentLog) -> str:
    return f"host {event.host}: {event.text}" if event.notice else \
        f"agent {event.host}: {event.text}"


def _straggler(event: ev.Straggler) -> str:
    evidence = describe_evidence(event.evidence)
    line = (f"straggler: {event.label} is {event.slowdown:.2g}x slower than its peers"
            f"{': ' + evidence if evidence else ''}")
    if event.action == "replace" and event.spare is not None:
        then = f"{event.spare} replaces {event.host} at the next checkpoint" if event.spare else \
            f"no spare host is idle to take {event.host}'s place: named only"
        line += f"; {then} (restart.on_straggler: replace)"
    return line


def _launcher_failed(event: ev.LauncherFailed) -> str:
    if event.plan:  # the next generation could not be planned (e.g. hosts lost)
        return f"cannot go on: {event.error}"
    return f"mgpu-launch itself failed: {event.error_type}: {event.error}"


def checkpoint_moved(moved: Moved) -> str:
    """The default checkpoint directory was in use (`Launch.prepare`)."""
    return (f"{moved.wanted} is in use by another run: this run uses {moved.used} "
            "(it starts from scratch)")


def _at_step(step: int) -> str:
    return f" at step {step}" if step else ""


def _tail_cut(event: ev.TailCut) -> str:
    them = "them" if len(event.tasks) > 1 else "it"
    if event.why == "over":
        return (f"{', '.join(event.tasks)}: program over, still exiting {event.idle_s:g} s "
                f"later: the job is done, stopping {them} (TensorFlow's teardown would wait "
                "out a peer's heartbeat)")
    if event.why == "session":
        return (f"{', '.join(event.tasks)}: waiting for a TF1 session that needs "
                f"{event.peer}, which finished (exit 0{_at_step(event.step)}) "
                f"{event.idle_s:g} s ago: that session can no longer form; the job is "
                f"done, stopping {them}")
    if event.handlers_cut:  # their exit handlers (atexit) had not finished: said plainly
        return (f"warning: {', '.join(event.handlers_cut)}: exit handlers cut, unfinished "
                f"after {event.idle_s:g} s idle (restart.exit_handlers_s: "
                f"{event.handlers_s or 0:g}) at the final step {event.step} after "
                f"{event.peer} finished: stopping {', '.join(event.tasks)}; the job is "
                "done, but what the "
                "exit handlers do (an upload, a final write) may be incomplete")
    return (f"{', '.join(event.tasks)} sat idle {event.idle_s:g} s at the final step "
            f"{event.step} after {event.peer} finished: the job is done, stopping {them} "
            "(TensorFlow would wait out its peer's heartbeat)")


_TELLERS = {
    ev.FailureDetected: _failure,
    ev.RootCause: _root_cause,
    ev.Restart: _restart,
    ev.StopRequested: _stop,
    ev.TeardownBegun: _teardown,
    ev.StacksRequested: _stacks_requested,
    ev.TaskRestarted: _task_restarted,
    ev.TaskUnconfirmed: lambda e: f"{e.label}: no exit confirmed by its agent",
    ev.HostLost: lambda e: f"lost host {e.host}: {e.detail}",
    ev.HostWait: lambda e: f"waiting up to {e.timeout_s:g} s for host {e.host}: {e.detail}",
    ev.HostBack: lambda e: f"host {e.host} is back",
    ev.HostsChosen: lambda e: e.message or None,
    ev.Reaped: _reaped,
    ev.Resumed: _resumed,
    ev.ResumeBehind: _resume_behind,
    ev.CheckpointPassedOver: _passed_over,
    ev.Nonfinite: _nonfinite,
    ev.NonfiniteSave: _nonfinite_save,
    ev.LossSpike: _loss_spike,
    ev.BatchSkipped: _batch_skipped,
    ev.ReplayPassed: _replay_passed,
    ev.BatchSkipDone: _batch_skip_done,
    ev.KerasSwitched: _keras,
    ev.JobDone: lambda e: e.message or None,
    ev.BadMessage: lambda e: f"agent {e.host}: ignored a malformed message: {e.reason}",
    ev.AgentLog: _agent_log,
    ev.MemoryCopy: _memory_copy,
    ev.NotifyFailed: lambda e: f"notification {e.notify!r}: {e.reason}",
    ev.TailCut: _tail_cut,
    ev.Straggler: _straggler,
    ev.OutOfStepAhead: lambda e: f"warning: {e.label} {e.reason}",
    ev.LauncherFailed: _launcher_failed,
}
